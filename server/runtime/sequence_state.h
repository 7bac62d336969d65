// Implicit sequence state kept on an instance's device (config sequence_batching `state`).
// Includes LibTorch: for server/runtime's .cc files and their tests only.
#pragma once

#include <ATen/Tensor.h>
#include <ATen/core/ivalue.h>

#include <memory>
#include <vector>

#include "server/core/infer_request.h"
#include "server/core/model_spec.h"
#include "server/core/status.h"

namespace sluice {

// One instance's states: per SequenceStateSpec a tensor of [slots, dims...] on the instance's
// device, a row per sequence slot (SequenceBatchingSpec::SlotsPerInstance), each row the state
// its sequence's last request returned. The sequence batcher binds sequences to slots and labels
// every row of an execution with its slot (InferRequest::state_rows); a slot changes hands only
// at a sequence's start, which reads the initial value. Per execution and state the gather costs
// one index_select over the batch's rows (plus a `where` when some row starts or has no
// sequence) and keeping costs one index_copy_, both on the device, with the row indices copied
// from the host: no state crosses to the host. Worker thread only, like the instance.
class SequenceStateStore {
 public:
  // Null when `spec` keeps no state. Every row starts at the initial value (`initial`, or zeros).
  static std::unique_ptr<SequenceStateStore> Create(const ModelSpec& spec,
                                                    const at::Device& device);

  // Puts each state input of `batch` into `inputs` (one value per declared input, config order):
  // [rows, dims...] (dims alone for a model without a batch dimension), each row its slot's kept
  // state, or the initial value for a row that starts its sequence or has none.
  void Gather(const InferRequest& batch, std::vector<c10::IValue>* inputs) const;

  // Keeps each state output of `outputs` (one value per declared output, config order) in the
  // slots of `batch`'s rows that have a sequence. INTERNAL, keeping nothing, when the model
  // returned a state that is not a tensor of the state's type and [rows, dims...].
  Status Keep(const InferRequest& batch, const std::vector<c10::IValue>& outputs);

  // The device memory the rows take.
  size_t bytes() const;

 private:
  struct State {
    const SequenceStateSpec* spec;
    size_t input;        // index among ModelSpec::inputs
    size_t output;       // index among ModelSpec::outputs
    at::Tensor initial;  // [dims...] on the device
    at::Tensor rows;     // [slots, dims...] on the device
  };
  SequenceStateStore(const ModelSpec* spec, at::Device device) : spec_(spec), device_(device) {}

  const ModelSpec* const spec_;  // the instance's, which outlives this
  const at::Device device_;
  std::vector<State> states_;
};

}  // namespace sluice
