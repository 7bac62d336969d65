// A floor under the stack size libraries ask for their threads.
//
// Debian's civetweb (the HTTP server under prometheus-cpp's exposer) is built to give its
// threads a fixed 100 KiB stack. glibc puts the static TLS of every loaded library at the top of
// each thread's stack and refuses (EINVAL) a stack smaller than that: with LibTorch and its CUDA
// libraries loaded the static TLS is about 200 KiB (cublasLt alone 94 KiB), so the /metrics
// endpoint could not start a thread. This definition in the executable takes precedence over
// libc's for every library (ELF symbol interposition) and raises any request below 2 MiB (ten
// times today's static TLS) to 2 MiB; larger requests pass unchanged. Thread stacks are
// reserved, not committed, memory.
#include <dlfcn.h>
#include <pthread.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>

namespace {
constexpr size_t kMinThreadStackBytes = size_t{2} << 20;
}  // namespace

extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t size) {
  using Function = int (*)(pthread_attr_t*, size_t);
  static const Function next =
      reinterpret_cast<Function>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  if (next == nullptr) return ENOSYS;
  return next(attr, std::max(size, kMinThreadStackBytes));
}
