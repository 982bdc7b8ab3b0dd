import json, sys, os
ref, new = sys.argv[1], sys.argv[2]
bad = 0
for name in sorted(os.listdir(ref)):
    p = os.path.join(ref, name, 'train.jsonl')
    if not os.path.exists(p): continue
    def rows(q):
        out = []
        for l in open(q):
            j = json.loads(l)
            out.append((j.get('type'), j.get('step'), j.get('loss'), j.get('eval_loss'), j.get('counted_tokens'), j.get('grad_norm'), j.get('data_position')))
        return out
    a = rows(p); b = rows(os.path.join(new, name, 'train.jsonl')) if os.path.exists(os.path.join(new, name, 'train.jsonl')) else []
    same = a == b
    bad += not same
    print(f"{name}: {len(a)} lines, {'bit-identical' if same else 'DIFFER'}; last loss {a[-1][2] if a else None} vs {b[-1][2] if b else None}")
sys.exit(1 if bad else 0)
