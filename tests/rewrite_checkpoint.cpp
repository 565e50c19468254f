// Test helper for the end-to-end checkpoint tests (not installed): reads a
// checkpoint and writes it again with the single writer of
// src/io/checkpoint.h (rank 0 alone, no MPI-IO), so a test can compare a
// file the ranks wrote collectively with the one the single writer makes
// of the same state.
//
//   rewrite_checkpoint IN.h5 OUT.h5
//
// Exit 0 when written; 1 with one line on stderr when IN cannot be read or
// OUT cannot be written; 2 for a usage error.
#include <cstdio>
#include <exception>
#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "src/core/parameters.h"
#include "src/io/checkpoint.h"
#include "src/parallel/collective_checkpoint.h"

using namespace mpiformer;

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: rewrite_checkpoint IN.h5 OUT.h5\n");
    return 2;
  }
  try {
    const LoadedCheckpoint c = read_checkpoint(argv[1]);
    std::unique_ptr<Ops> ops = make_cpu_ops(1);
    ParameterSet params(*ops);
    for (const CheckpointTensor& t : c.params) params.add(t.name, t.shape, false, Init::kZeros);
    params.allocate(0);
    std::vector<float> m(params.count()), v(params.count());  // (params.count())
    unpack_checkpoint_tensors(c.path, c.params, params, params.params());
    unpack_checkpoint_tensors(c.path, c.m, params, m.data());
    unpack_checkpoint_tensors(c.path, c.v, params, v.data());
    write_checkpoint(argv[2], params, m.data(), v.data(), c.state);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rewrite_checkpoint: %s\n", e.what());
    return 1;
  }
  return 0;
}
