// embedding.wgsl — token embedding lookup, one vocabulary chunk per dispatch.
// A big table E[V, C] lives in row chunks (each under maxStorageBufferBindingSize);
// the model dispatches once per chunk and a row of x is written by exactly the
// dispatch whose chunk [v0, v0 + Vc) holds its id (ids are checked on the host).
//
// embedding_forward   x[n, :] = E[ids[n], :]
//   0 params EmbeddingParams {N, C, v0, Vc} | 1 ids[N] u32 read | 2 e[Vc, C] read (rows v0..v0+Vc of E;
//   f32, or bf16 two per u32, low half first, when the override EMB_BF16 is true) |
//   3 x[N, C] write
//   dispatch: ceil(N*C / 256) workgroups split over x, y

struct EmbeddingParams { n: u32, c: u32, v0: u32, vc: u32 };
@group(0) @binding(0) var<uniform> p: EmbeddingParams;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read> e: array<u32>;
override EMB_BF16: bool = false;
@group(0) @binding(3) var<storage, read_write> x: array<f32>;

@compute @workgroup_size(256)
fn embedding_forward(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                     @builtin(num_workgroups) nw: vec3<u32>) {
    let i = (wid.x + wid.y * nw.x) * 256u + lid.x;
    if (i >= p.n * p.c) { return; }
    let n = i / p.c;
    let c = i % p.c;
    let id = ids[n];
    if (id < p.v0 || id >= p.v0 + p.vc) { return; }
    let k = (id - p.v0) * p.c + c;
    if (EMB_BF16) {
        x[i] = bf16_at(e[k >> 1u], k);
    } else {
        x[i] = bitcast<f32>(e[k]);
    }
}
