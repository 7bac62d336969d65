// The child side of an operator library's probe (operator_libraries.h), and the dispatcher's list
// of operators: the only parts of the operator libraries that need LibTorch's headers.
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <string>
#include <vector>

#include <ATen/core/dispatch/Dispatcher.h>

#include "server/runtime/operator_libraries.h"

namespace sluice {

std::vector<std::string> RegisteredOperators() {
  std::vector<std::string> names;
  for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
    names.push_back(name.overload_name.empty() ? name.name : name.name + "." + name.overload_name);
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

int RunOperatorLibraryProbe(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stdout, "error: usage: %s %s LIBRARY [ALREADY_LOADED...]\n", argv[0],
                 kProbeArgument);
    return 2;
  }
  // The libraries the server has loaded, in its order, so that a namespace the candidate takes
  // again fails here as it would there.
  for (int i = 3; i < argc; ++i) {
    if (dlopen(argv[i], RTLD_NOW | RTLD_LOCAL) == nullptr) {
      const char* error = dlerror();
      std::fprintf(stdout, "error: the already loaded library %s does not load again: %s\n",
                   argv[i], error ? error : "unknown error");
      return 4;
    }
  }
  const std::vector<std::string> before = RegisteredOperators();
  void* handle = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* error = dlerror();
    std::fprintf(stdout, "error: it does not load: %s\n", error ? error : "unknown error");
    return 3;
  }
  const std::vector<std::string> after = RegisteredOperators();
  std::vector<std::string> added;
  std::set_difference(after.begin(), after.end(), before.begin(), before.end(),
                      std::back_inserter(added));
  for (const std::string& name : added) std::fprintf(stdout, "operator %s\n", name.c_str());
  std::fprintf(stdout, "init_hook %s\n",
               dlsym(handle, "triton_pytorch_model_init") != nullptr ? "yes" : "no");
  std::fflush(stdout);
  return 0;
}

}  // namespace sluice
