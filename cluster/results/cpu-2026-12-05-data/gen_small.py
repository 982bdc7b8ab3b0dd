import h5py, numpy as np
rng = np.random.default_rng(5)
T = 30000
ids = rng.integers(0, 256, T, dtype=np.int64)
mask = (rng.random(T) < 0.7).astype(np.uint8)
lens = rng.integers(10, 300, T)
offs = np.concatenate([[0], np.cumsum(lens)])
offs = offs[offs < T]; offs = np.concatenate([offs, [T]]).astype(np.int64)
with h5py.File('plain.h5', 'w') as f: f['input_ids'] = ids.astype(np.int32)
with h5py.File('masked.h5', 'w') as f: f['input_ids'] = ids.astype(np.int32); f['loss_mask'] = mask
with h5py.File('docs.h5', 'w') as f:
    f['input_ids'] = ids.astype(np.int32); f['loss_mask'] = mask; f['document_offsets'] = offs
with h5py.File('i64docs.h5', 'w') as f: f['input_ids'] = ids[:20011]; o = offs[offs < 20011]; f['document_offsets'] = np.concatenate([o, [20011]]).astype(np.int64)
# chunked + compressed copy: the HDF5 hyperslab path
with h5py.File('chunked.h5', 'w') as f:
    f.create_dataset('input_ids', data=ids.astype(np.int32), chunks=(1000,), compression='gzip')
    f.create_dataset('loss_mask', data=mask, chunks=(1000,), compression='gzip')
    f.create_dataset('document_offsets', data=offs, chunks=(100,))
