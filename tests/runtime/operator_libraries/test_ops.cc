// An operator library for the tests, built against the torch wheel's LibTorch as users build
// theirs: one operator, sluice_test::scale_add(x, alpha) = x * alpha + 1 (one kernel for every
// device), and Triton's MODEL_INIT_LIBRARY hooks, which append "init <version dir> <device>"
// and "fini <device>" lines to the file $SLUICE_TEST_INIT_LOG names. Its code runs as soon as it is
// loaded (a static initializer appends "loaded <pid>" to $SLUICE_TEST_LOAD_MARKER), as a hostile
// library's would: the pinned-code tests show that a refused file never got that far.
#include <cstdio>
#include <cstdlib>

#include <unistd.h>

#include <ATen/ATen.h>
#include <torch/library.h>

namespace {

at::Tensor ScaleAdd(const at::Tensor& x, double alpha) { return x * alpha + 1; }

void Log(const char* format, const char* text, int device) {
  const char* path = std::getenv("SLUICE_TEST_INIT_LOG");
  if (path == nullptr) return;
  if (FILE* file = std::fopen(path, "a")) {
    std::fprintf(file, format, text, device);
    std::fclose(file);
  }
}

// Runs when the library is loaded (dlopen, or the probe's child).
[[maybe_unused]] const bool kMarked = [] {
  if (const char* path = std::getenv("SLUICE_TEST_LOAD_MARKER")) {
    if (FILE* file = std::fopen(path, "a")) {
      std::fprintf(file, "loaded %d\n", static_cast<int>(getpid()));
      std::fclose(file);
    }
  }
  return true;
}();

}  // namespace

TORCH_LIBRARY(sluice_test, m) { m.def("scale_add(Tensor x, float alpha) -> Tensor", &ScaleAdd); }

extern "C" {

__attribute__((visibility("default"))) void* triton_pytorch_model_init(const char* version_dir,
                                                                       int device_index) {
  Log("init %s %d\n", version_dir, device_index);
  return new int(device_index);
}

__attribute__((visibility("default"))) void triton_pytorch_model_fini(void* state) {
  int* device = static_cast<int*>(state);
  Log("fini%s %d\n", "", *device);
  delete device;
}

}  // extern "C"
