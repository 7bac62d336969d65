#include "server/batching/admission.h"

#include <algorithm>
#include <cassert>

#include "absl/strings/str_cat.h"

namespace sluice {

bool ByteBudget::TryAcquire(size_t bytes) {
  size_t used = used_.load(std::memory_order_relaxed);
  do {
    if (used + bytes > limit_) return false;
  } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
  return true;
}

Admission::Admission(Options options)
    : options_(std::move(options)), shares_(static_cast<size_t>(std::max(1, options_.shares))) {}

Admission::~Admission() { ReleaseAll(); }

Status Admission::Admit(int share, size_t bytes, absl::string_view model,
                        CountRefusal count_refusal) {
  Share& counted = shares_[share];
  const size_t cap = static_cast<size_t>(share) < options_.share_max_requests.size()
                         ? options_.share_max_requests[static_cast<size_t>(share)]
                         : options_.max_requests;
  if (counted.requests >= cap) return count_refusal(counted.requests);
  const size_t held = options_.bytes_across_shares ? total_bytes() : counted.bytes;
  if (held > 0 && held + bytes > options_.max_bytes) {
    return absl::UnavailableError(absl::StrCat(
        "model '", model, "' has ", held, " input bytes waiting and this request brings ", bytes,
        " (limit sluice.max_queued_bytes=", options_.max_bytes, "); retry later"));
  }
  if (options_.server_budget && !options_.server_budget->TryAcquire(bytes)) {
    return absl::UnavailableError(absl::StrCat(
        "the server has ", options_.server_budget->used(), " input bytes waiting (limit ",
        options_.server_budget->limit(), ", --max-queued-bytes); retry later"));
  }
  ++counted.requests;
  counted.bytes += bytes;
  return absl::OkStatus();
}

void Admission::Release(int share, size_t bytes) {
  Share& counted = shares_[share];
  assert(counted.requests > 0 && counted.bytes >= bytes);
  --counted.requests;
  counted.bytes -= bytes;
  if (options_.server_budget) options_.server_budget->Release(bytes);
}

void Admission::Move(int from, int to, size_t requests, size_t bytes) {
  assert(shares_[from].requests >= requests && shares_[from].bytes >= bytes);
  shares_[from].requests -= requests;
  shares_[from].bytes -= bytes;
  shares_[to].requests += requests;
  shares_[to].bytes += bytes;
}

void Admission::ReleaseAll() {
  for (Share& counted : shares_) {
    if (options_.server_budget) options_.server_budget->Release(counted.bytes);
    counted = Share{};
  }
}

size_t Admission::total_requests() const {
  size_t total = 0;
  for (const Share& counted : shares_) total += counted.requests;
  return total;
}

size_t Admission::total_bytes() const {
  size_t total = 0;
  for (const Share& counted : shares_) total += counted.bytes;
  return total;
}

}  // namespace sluice
