// The tensor types that cross Sluice's module seams (no protobuf, no torch on either side).
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "server/core/data_type.h"
#include "server/core/status.h"

namespace sluice {

using Shape = std::vector<int64_t>;

// Number of elements in `shape`; INVALID_ARGUMENT for negative dimensions or an element count that
// overflows (so a hostile shape cannot make us allocate or index out of range).
StatusOr<int64_t> ElementCount(const Shape& shape);

// "[2,3,224,224]", for messages and logs.
std::string ShapeToString(const Shape& shape);

// Bytes copied of held tensors on their way from one model to the next (an ensemble request's),
// by where the copy ran. Thread-safe: the runtimes that copy count from their workers.
struct CopyLedger {
  // Within the memory the tensors live in (a GPU's; the host's for CPU models): a gather of
  // several producers' rows into one batch, a CUDA graph's output kept past the next replay.
  std::atomic<uint64_t> on_device{0};
  // Between a device and host memory: a step's output brought to the host because its reader
  // needs host bytes (a response cache key, padding, a model on another kind of device).
  std::atomic<uint64_t> through_host{0};
};

// A tensor that one model hands another without passing through host buffers: an ensemble
// step's output that the next step reads where the runtime made it (a GPU's memory, or LibTorch's
// own host memory on a CPU instance); the runtime implements it. Left where its runtime made it.
// Immutable once shared; its memory lives while any holder does. The producer's work on it is
// complete before it is handed out, so a reader on any stream or thread may read it. Thread-safe.
class HeldTensor {
 public:
  // `device`: the GPU ordinal the bytes are on; kHost: host memory.
  static constexpr int kHost = -1;
  HeldTensor(DataType dtype, Shape shape, size_t byte_size, int device)
      : dtype_(dtype), shape_(std::move(shape)), byte_size_(byte_size), device_(device) {}
  virtual ~HeldTensor() = default;
  HeldTensor(const HeldTensor&) = delete;
  HeldTensor& operator=(const HeldTensor&) = delete;

  DataType dtype() const { return dtype_; }
  // Row-major, the caller's shape (the batch dimension first when the producer batches).
  const Shape& shape() const { return shape_; }
  size_t byte_size() const { return byte_size_; }
  int device() const { return device_; }

  // Copies the bytes into host memory at `to` (byte_size() bytes) and waits for the copy. Does
  // not count it: a reader that copies between models calls Count.
  virtual Status CopyToHost(char* to) const = 0;
  // The bytes themselves when they lie in host memory this process reads directly (a CPU
  // model's output), row-major and contiguous; null when they are on a device. A reader on the
  // host copies from here with memcpy instead of CopyToHost.
  virtual const char* host_data() const { return nullptr; }
  // The bytes into host memory at `to`: a memcpy from host_data, else CopyToHost. Not counted.
  Status ReadInto(char* to) const {
    if (host_data() == nullptr) return CopyToHost(to);
    if (byte_size_ > 0) std::memcpy(to, host_data(), byte_size_);
    return absl::OkStatus();
  }

  // Where copies of this tensor are counted; null (the default): nowhere. Set by whoever takes it
  // from its producer, before sharing it.
  void set_ledger(std::shared_ptr<CopyLedger> ledger) { ledger_ = std::move(ledger); }
  void Count(bool on_device, size_t bytes) const {
    if (ledger_ == nullptr || bytes == 0) return;
    (on_device ? ledger_->on_device : ledger_->through_host)
        .fetch_add(bytes, std::memory_order_relaxed);
  }
  // Bytes the producer copied on its device to hand this tensor out (a CUDA graph's output,
  // which the next replay overwrites, or an output that shared the producer's input memory).
  size_t copied_at_birth() const { return copied_at_birth_; }
  void set_copied_at_birth(size_t bytes) { copied_at_birth_ = bytes; }

 private:
  const DataType dtype_;
  const Shape shape_;
  const size_t byte_size_;
  const int device_;
  std::shared_ptr<CopyLedger> ledger_;
  size_t copied_at_birth_ = 0;
};

// Rows of a batch input that are held tensors instead of bytes in TensorView::data: rows
// [first_row, first_row + tensor->shape()[0]) (the whole input for a model that does not batch).
struct HeldRows {
  int64_t first_row = 0;
  std::shared_ptr<const HeldTensor> tensor;
};

// A non-owning view of one input tensor's little-endian, row-major bytes. Whoever builds the
// InferRequest guarantees that `data` outlives it (see InferRequest). Rows listed in `held` are
// not in `data`: a request's input is either bytes or one held tensor (`data` null); a batch
// assembled from several requests has its held rows here and the others in `data` (null when
// every row is held; padding rows are then zero).
struct TensorView {
  std::string name;
  DataType dtype = DataType::kFp32;
  Shape shape;
  const char* data = nullptr;
  size_t byte_size = 0;  // of the whole tensor, held rows included
  std::vector<HeldRows> held;
};

// Brings `view`'s held rows to host memory: `*bytes` receives the whole tensor (the rows in
// `data`, the held rows copied and counted) and `view` then reads it.
Status LoadHeldRows(TensorView* view, std::string* bytes);

// An owning tensor, used for outputs: `data` is a std::string so that the front ends can move it
// into the protobuf response without another copy.
struct Tensor {
  std::string name;
  DataType dtype = DataType::kFp32;
  Shape shape;
  std::string data;
};

}  // namespace sluice
