#include "server/runtime/sequence_state.h"

#include <ATen/ATen.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#include "server/runtime/torch_common.h"

namespace sluice {
namespace {

// The rows an execution has: its batch size when the model batches, else one.
int64_t RowsOf(const ModelSpec& spec, const InferRequest& batch) {
  return spec.batches() ? batch.batch_size : 1;
}

// The StateRow of row `row` (none recorded: a row without a sequence).
StateRow RowOf(const InferRequest& batch, int64_t row) {
  const auto index = static_cast<size_t>(row);
  return index < batch.state_rows.size() ? batch.state_rows[index] : StateRow{};
}

at::Tensor OnDevice(const std::vector<int64_t>& values, const at::Device& device) {
  at::Tensor host = at::tensor(values, at::TensorOptions().dtype(at::kLong));
  return device.is_cuda() ? host.to(device) : host;
}

}  // namespace

std::unique_ptr<SequenceStateStore> SequenceStateStore::Create(const ModelSpec& spec,
                                                               const at::Device& device) {
  const SequenceBatchingSpec& batching = spec.sequence_batching;
  if (batching.states.empty()) return nullptr;
  std::unique_ptr<SequenceStateStore> store(new SequenceStateStore(&spec, device));
  const int64_t slots = batching.SlotsPerInstance(spec.max_batch_size);
  for (const SequenceStateSpec& state : batching.states) {
    const at::TensorOptions options = at::TensorOptions().dtype(ToScalarType(state.dtype));
    at::Tensor initial =
        state.initial
            ? at::from_blob(const_cast<char*>(state.initial->data()), state.dims, options).clone()
            : at::zeros(state.dims, options);
    initial = initial.to(device);
    std::vector<int64_t> shape{slots};
    shape.insert(shape.end(), state.dims.begin(), state.dims.end());
    at::Tensor rows = initial.unsqueeze(0).expand(shape).contiguous();
    store->states_.push_back(State{&state, DeclaredIndex(spec.inputs, state.input),
                                   DeclaredIndex(spec.outputs, state.output), std::move(initial),
                                   std::move(rows)});
  }
  return store;
}

size_t SequenceStateStore::bytes() const {
  size_t total = 0;
  for (const State& state : states_) total += state.rows.nbytes();
  return total;
}

void SequenceStateStore::Gather(const InferRequest& batch, std::vector<c10::IValue>* inputs) const {
  const int64_t rows = RowsOf(*spec_, batch);
  std::vector<int64_t> slots(static_cast<size_t>(rows), 0);
  std::vector<int64_t> fresh(static_cast<size_t>(rows), 0);
  bool any_fresh = false, all_fresh = true;
  for (int64_t row = 0; row < rows; ++row) {
    const StateRow state = RowOf(batch, row);
    const bool initial = state.slot < 0 || state.start;
    slots[static_cast<size_t>(row)] = state.slot < 0 ? 0 : state.slot;
    fresh[static_cast<size_t>(row)] = initial ? 1 : 0;
    any_fresh = any_fresh || initial;
    all_fresh = all_fresh && initial;
  }
  at::Tensor slot_index, fresh_mask;
  if (!all_fresh) slot_index = OnDevice(slots, device_);
  if (any_fresh && !all_fresh) fresh_mask = OnDevice(fresh, device_).to(at::kBool);
  for (const State& state : states_) {
    std::vector<int64_t> shape{rows};
    shape.insert(shape.end(), state.spec->dims.begin(), state.spec->dims.end());
    at::Tensor value;
    if (all_fresh) {
      value = state.initial.unsqueeze(0).expand(shape).contiguous();
    } else {
      value = state.rows.index_select(0, slot_index);
      if (any_fresh) {
        std::vector<int64_t> mask_shape(shape.size(), 1);
        mask_shape[0] = rows;
        value = at::where(fresh_mask.view(mask_shape), state.initial.unsqueeze(0), value);
      }
    }
    if (!spec_->batches()) value = value.select(0, 0);
    (*inputs)[state.input] = std::move(value);
  }
}

Status SequenceStateStore::Keep(const InferRequest& batch,
                                const std::vector<c10::IValue>& outputs) {
  const int64_t rows = RowsOf(*spec_, batch);
  std::vector<int64_t> kept_rows, kept_slots;
  for (int64_t row = 0; row < rows; ++row) {
    const StateRow state = RowOf(batch, row);
    if (state.slot < 0) continue;
    kept_rows.push_back(row);
    kept_slots.push_back(state.slot);
  }
  // Checked before anything is kept: a bad state leaves every slot as it was.
  std::vector<at::Tensor> values;
  for (const State& state : states_) {
    const c10::IValue& output = outputs[state.output];
    std::vector<int64_t> shape;
    if (spec_->batches()) shape.push_back(rows);
    shape.insert(shape.end(), state.spec->dims.begin(), state.spec->dims.end());
    if (!output.isTensor() || output.toTensor().scalar_type() != ToScalarType(state.spec->dtype) ||
        !output.toTensor().sizes().equals(shape)) {
      const std::string got =
          output.isTensor()
              ? absl::StrCat(std::string(c10::toString(output.toTensor().scalar_type())), " [",
                             absl::StrJoin(output.toTensor().sizes(), ","), "]")
              : std::string(output.tagKind());
      return absl::InternalError(
          absl::StrCat("model '", spec_->name, "' returned state output '", state.spec->output,
                       "' as ", got, "; its sequence_batching state is ",
                       DataTypeName(state.spec->dtype), " [", absl::StrJoin(shape, ","), "]"));
    }
    at::Tensor value = output.toTensor();
    if (!spec_->batches()) value = value.unsqueeze(0);
    values.push_back(value.to(device_));
  }
  if (kept_rows.empty()) return absl::OkStatus();
  const at::Tensor slot_index = OnDevice(kept_slots, device_);
  const bool every_row = static_cast<int64_t>(kept_rows.size()) == rows;
  const at::Tensor row_index = every_row ? at::Tensor() : OnDevice(kept_rows, device_);
  for (size_t i = 0; i < states_.size(); ++i) {
    states_[i].rows.index_copy_(0, slot_index,
                                every_row ? values[i] : values[i].index_select(0, row_index));
  }
  return absl::OkStatus();
}

}  // namespace sluice
