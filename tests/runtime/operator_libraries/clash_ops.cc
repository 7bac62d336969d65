// An operator library for the tests that takes the namespace of libsluice_test_ops.so
// (sluice_test) with TORCH_LIBRARY again: loaded after it, LibTorch aborts the process from this
// library's static initializer ("Only a single TORCH_LIBRARY can be used to register the
// namespace"), which is what the server's probe must catch in its child.
#include <ATen/ATen.h>
#include <torch/library.h>

namespace {
at::Tensor Identity(const at::Tensor& x) { return x; }
}  // namespace

TORCH_LIBRARY(sluice_test, m) { m.def("clash(Tensor x) -> Tensor", &Identity); }
