// replay.js — encode a recorded program (py/bitlora/gpu/device.py Program) into a
// command encoder: one call per replay instead of several Pyodide -> JS calls per
// dispatch. Generic: it knows dispatches, copies and clears, nothing of any model.
//
// program: {code: Float64Array, pipelines: [GPUComputePipeline], bindGroups: [GPUBindGroup],
//           buffers: [GPUBuffer]}; code is a flat list of commands:
//   0 pipeline bindGroup x y z              dispatchWorkgroups(x, y, z) (bind group 0)
//   1 src srcOffset dst dstOffset size      copyBufferToBuffer
//   2 buffer offset size                    clearBuffer
// (pipeline, bindGroup, src, dst, buffer: indices into the arrays). Consecutive
// dispatches share one compute pass; a copy or clear ends it.
export function replay(encoder, program) {
  const { code, pipelines, bindGroups, buffers } = program;
  let pass = null;
  let last = null;
  for (let i = 0; i < code.length;) {
    const op = code[i];
    if (op === 0) {
      if (pass === null) {
        pass = encoder.beginComputePass();
        last = null;
      }
      const pipeline = pipelines[code[i + 1]];
      if (pipeline !== last) {
        pass.setPipeline(pipeline);
        last = pipeline;
      }
      pass.setBindGroup(0, bindGroups[code[i + 2]]);
      pass.dispatchWorkgroups(code[i + 3], code[i + 4], code[i + 5]);
      i += 6;
      continue;
    }
    if (pass !== null) {
      pass.end();
      pass = null;
    }
    if (op === 1) {
      encoder.copyBufferToBuffer(buffers[code[i + 1]], code[i + 2], buffers[code[i + 3]], code[i + 4], code[i + 5]);
      i += 6;
    } else if (op === 2) {
      encoder.clearBuffer(buffers[code[i + 1]], code[i + 2], code[i + 3]);
      i += 4;
    } else {
      throw new Error(`replay: unknown command ${op} at ${i}`);
    }
  }
  if (pass !== null) pass.end();
}
