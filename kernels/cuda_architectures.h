// Which GPUs a build's kernels run on, from its CMAKE_CUDA_ARCHITECTURES
// list ("80-real;86-real;89-real;90"). Plain C++: the CPU build and its tests
// include it.
#pragma once

#include <string>

namespace mpiformer {

// Whether kernels built for `architectures` (entries apart by ';' or ',')
// run on a GPU of compute
// capability major.minor: machine code for NN ("NN" or "NN-real") runs on
// capability NN and on the later minors of its major (sm_80's on 8.6 and
// 8.9); PTX for NN ("NN" or "NN-virtual") is compiled at load for NN and
// every later capability. "all", "all-major" and "native" run anywhere the
// build ran.
bool architectures_run_on(const std::string& architectures, int major, int minor);

// "" where they run on the GPU; otherwise one line naming it, its
// capability and what to build.
std::string architectures_problem(const std::string& architectures, int major, int minor,
                                  const std::string& gpu);

}  // namespace mpiformer
