"""A short soak (bench/soak.py; the long one's figures are in docs/RELIABILITY.md): 150
optimizer steps of the demo on 20 records, natively. After the first epoch the GPU
buffer bytes and count, the bind-group cache and the Python heap (the metrics history
left out) grow by less than 2 %."""
from bitlora.bench.soak import soak


def test_short_soak_is_flat():
    res = soak(150, records=20, every=5)
    first, last = res["rows"][0], res["rows"][-1]
    print(f"\n{res['seconds']:.0f} s; after step {res['warmup']}: "
          + ", ".join(f"{m} {100 * g:+.2f} %" for m, g in res["growth"].items())
          + f"; heap {first['heap']} -> {last['heap']} B, GPU {last['gpu_bytes']} B in {last['gpu_buffers']} buffers")
    assert all(g < 0.02 for g in res["growth"].values()), res["growth"]
