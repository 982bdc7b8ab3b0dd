import json, random, sys
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
rng = random.Random(1)
words = ("the a of to and in is it that for on with as was by at be this from or have an not are but which one all "
         "they we his her can has more will when there what their about if would so out up into them some time could "
         "these two may then do first any my now such like our over man me even most made after also did many before").split()
def sent(n): return " ".join(rng.choice(words) for _ in range(n))
tok = Tokenizer(models.BPE(unk_token="<unk>")); tok.pre_tokenizer = pre_tokenizers.Whitespace()
tok.train_from_iterator([sent(20) for _ in range(2000)], trainers.BpeTrainer(vocab_size=250, special_tokens=["<|endoftext|>", "<unk>"]))
tok.save("/work/data/c/tok/tokenizer.json")
print("vocab", tok.get_vocab_size())
target = int(sys.argv[1]); n = 0
pool = [json.dumps({"prompt": sent(rng.randint(5, 60)), "response": sent(rng.randint(5, 120))}) + "\n" for _ in range(20000)]
with open("/work/data/c/sft1g.jsonl", "w") as f:
    while n < target:
        line = pool[rng.randrange(len(pool))] if rng.random() < 0.5 else json.dumps({"prompt": sent(rng.randint(5, 60)), "response": sent(rng.randint(5, 120))}) + "\n"
        f.write(line); n += len(line)
print("bytes", n)
