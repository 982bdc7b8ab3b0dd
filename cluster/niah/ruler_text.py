"""RULER's other task families in natural language, for cluster/niah/build_niah_set.py.

The token-space versions live in model/eval/ruler.h (eval-niah --task); these follow RULER's own
templates (Hsieh et al. 2024, "RULER: What's the real context size of your long-context language
models?") as text, tokenized with the checkpoint's tokenizer and written in the same eval-set
format (model/eval/niah_set.h) with an `item_separator`: every answer is its items, each tokenized
alone with a leading space, joined by the id of ",", so `hydra eval-niah --dataset` scores recall
item by item in any order (RULER's string_match_all) beside the exact-match verdict.

  multiquery  --queries needles " The special magic number for K is V." with distinct keys (the
              first at the depth, the others uniform) in the haystack; the query asks for all the
              keys' numbers; answer V_1, ..., V_Q in query order.
  vartrack    --chains chains of --hops + 1 statements " VAR X0 = V." " VAR X1 = VAR X0." ... (5
              capital letters a variable, values of --digits digits) in the haystack in context
              order: chain 0's first statement at the depth, its hops after it at uniform points,
              the other chains anywhere in order; the query gives chain 0's value; answer its
              variables in chain order.
  cwe         a numbered list ("\\n1. word", number and word tokenized apart) in which
              --common-words words occur --common-freq times each and as many other words as fit
              --uncommon-freq times each, shuffled; answer the common words in order of first
              occurrence. Words: --words FILE, one a
              line, or the distinct lowercase words of the haystack.
  fwe         "coded words" (3-6 random lowercase letters, --fwe-words distinct, 0: a quarter of the
              occurrences) drawn from a Zipf law of exponent --zipf-alpha, as many as fit; answer
              the --top-words most frequent, most frequent first. Draws whose top counts tie are
              redrawn (up to 64 attempts). RULER's "...." noise between words is left out.
cwe and fwe place nothing at a depth: one cell per length (depth 0), as eval-niah --task does. A
list that does not fill the length exactly is preceded by as many haystack tokens as are missing
(fewer than one entry's worth for cwe, one word's for fwe). Every sample is exactly `length` tokens
and a function of (seed, task, length, depth, index).
"""
import random
import re
import string

from niah_text import arrange, assemble, distinct, draw_key, draw_value

FAMILIES = ("multiquery", "vartrack", "cwe", "fwe")
HAS_DEPTH = {"multiquery": True, "vartrack": True, "cwe": False, "fwe": False}


def join_words(words):
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def place(pieces, hay, starts, length, depth, head, needles, query, answer, other_points, in_order=False):
    """[head][haystack with needles at their points][query][answer], exactly `length` tokens.
    needles: id lists, the primary (at the depth) first; other_points(fill) gives every needle's point
    (the primary's entry is replaced). At equal points the primary goes first when depth <= 50, else
    last (as NIAH's); with in_order the needles keep their list order. Returns the sample's fields."""
    fill = length - len(head) - sum(len(n) for n in needles) - len(query) - len(answer)
    if fill < 0:
        raise SystemExit(f"build_niah_set: length {length} is too short: the instruction, statements, query and "
                         f"answer take {length - fill} tokens")
    points = other_points(fill)
    points[0] = round(depth * fill / 100)
    text_window, points, order = arrange(hay, starts, fill, points, depth, in_order)
    ids, answer_start, primary_position = assemble(head, text_window, points, order, needles, query, answer)
    assert len(ids) == length, (len(ids), length)
    return dict(ids=ids, answer_start=answer_start, answer_length=len(answer), needle_position=primary_position)


def multiquery(pieces, items, hay, starts, args, length, depth, rng):
    keys = distinct(args.queries, lambda: draw_key(rng))
    values = distinct(args.queries, lambda: draw_value(rng, args.digits))
    fractions = [rng.random() for _ in keys]
    head = pieces.ids("Some special magic numbers are hidden within the following text. Make sure to memorize them. "
                      "I will quiz you about the numbers afterwards.\n")
    needles = [pieces.ids(f" The special magic number for {k} is {v}.") for k, v in zip(keys, values)]
    asked = join_words(keys)
    query = pieces.ids(f"\nWhat are the special magic numbers for {asked}? The special magic numbers for {asked} are")
    return place(pieces, hay, starts, length, depth, head, needles, query, items.answer(values),
                 lambda fill: [min(fill, int(f * (fill + 1))) for f in fractions]), values


def variable(rng):
    return "".join(rng.choice(string.ascii_uppercase) for _ in range(5))


def vartrack(pieces, items, hay, starts, args, length, depth, rng):
    names = distinct(args.chains * (args.hops + 1), lambda: variable(rng))
    values = distinct(args.chains, lambda: draw_value(rng, args.digits))
    chains = [names[c * (args.hops + 1):(c + 1) * (args.hops + 1)] for c in range(args.chains)]
    needles, chain_of = [], []
    for c, chain in enumerate(chains):
        needles.append(pieces.ids(f" VAR {chain[0]} = {values[c]}."))
        needles += [pieces.ids(f" VAR {chain[h]} = VAR {chain[h - 1]}.") for h in range(1, len(chain))]
        chain_of += [c] * len(chain)
    draws = [sorted(rng.random() for _ in chain) for chain in chains]

    def points(fill):
        # Chain 0: its first statement at the depth (set by place), the hops after it in order;
        # the other chains in order anywhere. Equal points keep the chain's order (place sorts by j).
        first = round(depth * fill / 100)
        out = []
        for c, u in enumerate(draws):
            if c == 0:
                out += [first] + [first + min(fill - first, int(x * (fill - first + 1))) for x in u[1:]]
            else:
                out += [min(fill, int(x * (fill + 1))) for x in u]
        return out

    head = pieces.ids("Memorize and track the chain(s) of variable assignment hidden in the following text.\n")
    n = len(chains[0])
    query = pieces.ids(f"\nQuestion: Find all variables that are assigned the value {values[0]} in the text above. "
                       f"Answer: According to the chain(s) of variable assignment in the text above, {n} variables are "
                       f"assigned the value {values[0]}, they are:")
    sample = place(pieces, hay, starts, length, depth, head, needles, query, items.answer(chains[0]), points,
                   in_order=True)
    return sample, chains[0]


def word_pool(args, text):
    if args.words:
        with open(args.words, encoding="utf-8") as f:
            words = [w.strip() for w in f if w.strip()]
    else:
        words = re.findall(r"\b[a-z]{3,}\b", text)
    return sorted(set(words))


def pad_front(pieces, hay, starts, length, body_ids, answer_ids):
    """[haystack tokens to fill][body][answer]: exactly `length` tokens."""
    missing = length - len(body_ids) - len(answer_ids)
    assert missing >= 0
    ids = list(hay[:missing]) + body_ids
    return dict(ids=ids + answer_ids, answer_start=len(ids), answer_length=len(answer_ids), needle_position=-1)


def entry_ids(pieces, i, word):
    """The ids of list entry "\\n<i>. <word>": its number and its word tokenized apart (cached)."""
    cache = pieces.__dict__.setdefault("entry_cache", {})
    for text in (f"\n{i}.", f" {word}"):
        if text not in cache:
            cache[text] = pieces.ids(text)
    return cache[f"\n{i}."] + cache[f" {word}"]


def cwe(pieces, items, hay, starts, args, length, pool, rng):
    if len(pool) < args.common_words + 1:
        raise SystemExit(f"build_niah_set: cwe needs more than {args.common_words} distinct words; the pool has "
                         f"{len(pool)} (--words FILE)")
    head = pieces.ids("Below is a numbered list of words. In these words, some appear more often than others. "
                      "Memorize the ones that appear most often.")
    query = pieces.ids(f"\nQuestion: What are the {args.common_words} most common words in the above list? Answer: "
                       f"The top {args.common_words} words that appear most often in the list are:")
    chosen = rng.sample(pool, len(pool))
    common, others = chosen[:args.common_words], chosen[args.common_words:]
    order_seed = rng.random()

    def build(n_uncommon):
        occurrences = [w for w in common for _ in range(args.common_freq)]
        occurrences += [w for w in others[:n_uncommon] for _ in range(args.uncommon_freq)]
        random.Random(order_seed).shuffle(occurrences)
        body = list(head)
        for i, w in enumerate(occurrences, 1):
            body += entry_ids(pieces, i, w)
        firsts = sorted(common, key=occurrences.index)
        return body + query, items.answer(firsts), firsts

    # The most uncommon words that fit: a bisection on the token count (it grows with the words).
    lo, hi = 0, len(others)
    body, answer, firsts = build(0)
    if len(body) + len(answer) > length:
        raise SystemExit(f"build_niah_set: length {length} is too short for cwe: the common words alone take "
                         f"{len(body) + len(answer)} tokens")
    while lo < hi:
        mid = (lo + hi + 1) // 2
        b, a, _ = build(mid)
        if len(b) + len(a) <= length:
            lo = mid
        else:
            hi = mid - 1
    body, answer, firsts = build(lo)
    return pad_front(pieces, hay, starts, length, body, answer), firsts


def coded_word(rng):
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 6)))


def fwe(pieces, items, hay, starts, args, length, rng):
    head = pieces.ids("Read the following coded text and track the frequency of each coded word. Find the "
                      f"{args.top_words} most frequently appeared coded words.")
    query = pieces.ids(f"\nQuestion: Do not provide any explanation. What are the {args.top_words} most frequently "
                       f"appeared words in the above coded text? Answer: According to the coded text above, the "
                       f"{args.top_words} most frequently appeared words are:")
    for attempt in range(64):
        sample_words = [coded_word(rng) for _ in range(64)]
        mean_cost = sum(len(pieces.ids(" " + w)) for w in sample_words) / len(sample_words)
        room = length - len(head) - len(query)
        n_words = args.fwe_words or max(args.top_words + 1, int(room / mean_cost) // 4)
        words = distinct(n_words, lambda: coded_word(rng))
        weights = [1.0 / (r + 1) ** args.zipf_alpha for r in range(n_words)]
        # The answer's token count depends on which words win: reserve the longest top words.
        reserve = len(items.answer(sorted(words, key=lambda w: -len(pieces.ids(" " + w)))[:args.top_words]))
        body, counts = list(head), {}
        while True:
            w = rng.choices(words, weights)[0]
            cost = pieces.ids(" " + w)
            if len(body) + len(cost) + len(query) + reserve > length:
                break
            body += cost
            counts[w] = counts.get(w, 0) + 1
        ranked = sorted(counts.items(), key=lambda kv: -kv[1])
        top = [c for _, c in ranked[:args.top_words + 1]]
        if len(ranked) > args.top_words and all(top[i] > top[i + 1] for i in range(args.top_words)):
            firsts = [w for w, _ in ranked[:args.top_words]]
            return pad_front(pieces, hay, starts, length, body + query, items.answer(firsts)), firsts
    raise SystemExit(f"build_niah_set: fwe at length {length}: 64 draws left the top {args.top_words} counts tied "
                     "(more length, a larger --zipf-alpha or fewer --top-words)")


def build_family(pieces, items, hay, starts, pool, args, length, depth, index):
    """A sample of a RULER family and its answer items (strings, in answer order)."""
    rng = random.Random(f"{args.seed}/{args.task}/{length}/{index}")
    if args.task == "multiquery":
        return multiquery(pieces, items, hay, starts, args, length, depth, rng)
    if args.task == "vartrack":
        return vartrack(pieces, items, hay, starts, args, length, depth, rng)
    if args.task == "cwe":
        return cwe(pieces, items, hay, starts, args, length, pool, rng)
    return fwe(pieces, items, hay, starts, args, length, rng)
