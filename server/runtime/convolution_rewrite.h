// Gives every convolution of a loaded TorchScript module its own cuDNN flags.
//
// LibTorch's cuDNN benchmark flag is process-wide (at::globalContext().setBenchmarkCuDNN), but
// aten::_convolution takes benchmark, deterministic, cudnn_enabled and allow_tf32 as arguments.
// Rewriting each convolution call to aten::_convolution with those arguments as fresh constants
// makes the decision per model, whatever else the process runs; it also replaces the flags a
// traced model froze at trace time (pytorch/pytorch#18776).
//
// A scripted convolution (aten::conv2d, ...) also accepts an unbatched input, which
// aten::_convolution does not: for those the rewrite branches on the input's rank and keeps the
// original call (following the global flag) for an unbatched input.
#pragma once

#include <torch/script.h>

#include "server/core/backend.h"

namespace sluice {

struct ConvolutionFlags {
  bool benchmark = false;
  bool deterministic = false;
  bool cudnn_enabled = true;
  bool allow_tf32 = true;
};

// Rewrites every graph function of `module`'s compilation unit (every method of every submodule
// type, and free functions), including nested blocks. Must run before the module's first forward
// (the executors cache optimised graphs). Constants are never mutated in place: constant pooling
// may share one prim::Constant between a convolution's benchmark and another argument.
ConvolutionTuning RewriteConvolutions(const torch::jit::Module& module,
                                      const ConvolutionFlags& flags);

}  // namespace sluice
