"""The haystack-and-needle pieces every natural-language eval-set builder shares: the haystack window
that ends on a sentence, insertion points moved to sentence starts, the sample assembled from its
pieces, and the keys and values drawn for needles. cluster/niah/build_niah_set.py (NIAH's tasks) and
cluster/niah/ruler_text.py (RULER's other families) both import it; neither imports the other's
internals, so there is no cycle.

Needs: numpy.
"""
import numpy as np

ADJECTIVES = (
    "amber ancient bitter brave calm clever crimson curious distant eager fierce gentle golden hidden "
    "hollow humble icy jolly keen lively lucky misty modest narrow noble odd pale patient proud quiet "
    "rapid rustic sandy silent silver sleepy smooth solemn steady sturdy swift tender tidy vivid wary "
    "wild witty young zealous"
).split()
NOUNS = (
    "anchor badger banjo beacon canyon castle cedar comet cricket dolphin falcon fiddle forest "
    "garden glacier harbor hedgehog island kettle lantern lemon magnet meadow mirror needle orchard "
    "otter pebble pepper pigeon quarry raven ribbon saddle spruce squirrel teapot thistle tunnel "
    "violin walnut willow yacht zebra"
).split()


def window(hay, starts, fill):
    """The `fill` haystack tokens ending at the first sentence start >= fill, and their sentence starts."""
    k = int(np.searchsorted(starts, fill, side="left"))
    end = int(starts[k]) if k < len(starts) else fill
    begin = end - fill
    local = starts[(starts >= begin) & (starts <= end)] - begin
    return hay[begin:end], np.unique(np.concatenate([[0], local]))


def snap(point, fill, starts):
    """Moves an insertion point strictly inside the haystack back to its sentence's start."""
    if point <= 0 or point >= fill:
        return point
    k = int(np.searchsorted(starts, point, side="right")) - 1
    return int(starts[k]) if k >= 0 else point


def arrange(hay, starts, fill, points, depth, in_order=False):
    """The `fill`-token haystack window, the needles' insertion points in it (needle 0 the primary; a
    point strictly inside moved back to its sentence's start) and the order to insert them in: by point,
    and at equal points the primary first when depth <= 50, else last (in_order: the needles' order)."""
    text_window, window_starts = window(hay, starts, fill)
    points = [snap(p, fill, window_starts) for p in points]
    tie = 0 if in_order else (-1 if depth <= 50 else 1)
    order = sorted(range(len(points)), key=lambda j: (points[j], tie if j == 0 else 0, j))
    return text_window, points, order


def assemble(head, text_window, points, order, needles, query, answer):
    """[head][text_window with needles[j] after its first points[j] tokens, inserted in `order`][query][answer]
    as one id list. Returns it, the answer's start and the primary needle's (needle 0's) position."""
    ids, cursor, primary_position = list(head), 0, -1
    for j in order:
        ids += text_window[cursor:points[j]]
        cursor = points[j]
        if j == 0:
            primary_position = len(ids)
        ids += needles[j]
    ids += text_window[cursor:]
    ids += query
    answer_start = len(ids)
    ids += answer
    return ids, answer_start, primary_position


def distinct(n, draw):
    """n distinct results of draw(), in the order drawn (a repeat is drawn again)."""
    out = []
    while len(out) < n:
        x = draw()
        if x not in out:
            out.append(x)
    return out


def draw_key(rng):
    """A key "<adjective>-<noun>"."""
    return f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}"


def draw_value(rng, digits):
    """A value: a number of `digits` digits, as text."""
    return str(rng.randint(10 ** (digits - 1), 10**digits - 1))
