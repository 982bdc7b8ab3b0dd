import sys, h5py, numpy as np
T = int(sys.argv[2]); path = sys.argv[1]
rng = np.random.default_rng(42)
with h5py.File(path + '.tmp', 'w') as f:
    ids = f.create_dataset('input_ids', (T,), dtype=np.int32)
    mask = f.create_dataset('loss_mask', (T,), dtype=np.uint8)
    step = 50_000_000
    for a in range(0, T, step):
        b = min(T, a + step)
        ids[a:b] = rng.integers(0, 256, b - a, dtype=np.int32)
        mask[a:b] = (rng.random(b - a) < 0.8).astype(np.uint8)
import os; os.replace(path + '.tmp', path)
