# The tokenizer and tokenize commands of this build, as run.
# in-process (cluster/train_tokenizer.py absent): byte-level BPE --vocab 16384 /work/corpus/tokenizer/sample.jsonl
/root/.pyenv/versions/3.11.7/bin/python3 /work/wt-h58/cluster/tokenize_text.py --tokenizer /work/corpus/tokenizer/tokenizer.json --out /work/corpus/tokens/prose-train --processes 1 /work/corpus/text/prose-train.jsonl
/root/.pyenv/versions/3.11.7/bin/python3 /work/wt-h58/cluster/tokenize_text.py --tokenizer /work/corpus/tokenizer/tokenizer.json --out /work/corpus/tokens/prose-heldout --processes 1 /work/corpus/text/prose-heldout.jsonl
/root/.pyenv/versions/3.11.7/bin/python3 /work/wt-h58/cluster/tokenize_text.py --tokenizer /work/corpus/tokenizer/tokenizer.json --out /work/corpus/tokens/code-train --processes 1 /work/corpus/text/code-train.jsonl
/root/.pyenv/versions/3.11.7/bin/python3 /work/wt-h58/cluster/tokenize_text.py --tokenizer /work/corpus/tokenizer/tokenizer.json --out /work/corpus/tokens/code-heldout --processes 1 /work/corpus/text/code-heldout.jsonl
