// The LibTorch runtime on the CPU: loading, input/output binding, every datatype, failures.
#include <cmath>
#include <cstring>
#include <fstream>
#include <thread>

#include <ATen/Parallel.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/core/bytes_tensor.h"
#include "server/runtime/torch_backend.h"
#include "server/runtime/torch_common.h"
#include "tests/runtime/test_modules.h"
#include "tests/unit/fakes.h"

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using testing::SaveModule;

constexpr char kDouble[] = R"(
def forward(self, INPUT__0):
    return INPUT__0 + INPUT__0
)";

ModelSpec Spec(DataType in, DataType out, Shape in_dims = {-1}, Shape out_dims = {-1}) {
  ModelSpec spec;
  spec.name = "m";
  spec.max_batch_size = 8;
  spec.inputs = {{"INPUT__0", in, in_dims}};
  spec.outputs = {{"OUTPUT__0", out, out_dims}};
  return spec;
}

// Encodes `values` as little-endian elements of `type`.
std::string Encode(DataType type, const std::vector<double>& values) {
  std::string out;
  auto put = [&](auto v) { out.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  for (double v : values) {
    switch (type) {
      case DataType::kBool:
        put(static_cast<uint8_t>(v != 0));
        break;
      case DataType::kUint8:
        put(static_cast<uint8_t>(v));
        break;
      case DataType::kInt8:
        put(static_cast<int8_t>(v));
        break;
      case DataType::kInt16:
        put(static_cast<int16_t>(v));
        break;
      case DataType::kInt32:
        put(static_cast<int32_t>(v));
        break;
      case DataType::kInt64:
        put(static_cast<int64_t>(v));
        break;
      case DataType::kFp32:
        put(static_cast<float>(v));
        break;
      case DataType::kFp64:
        put(v);
        break;
      case DataType::kBf16: {
        const float f = static_cast<float>(v);
        uint32_t bits;
        std::memcpy(&bits, &f, 4);
        put(static_cast<uint16_t>(bits >> 16));  // exact for the small integers used here
        break;
      }
      case DataType::kFp16: {
        // Small integers only: 1.0 = 0x3c00; exponent bias 15.
        uint16_t bits = 0;
        if (v != 0) {
          int exponent = 0;
          const double mantissa = std::frexp(v, &exponent);  // v = mantissa * 2^exponent
          bits = static_cast<uint16_t>(((exponent - 1 + 15) << 10) |
                                       static_cast<uint16_t>((mantissa * 2 - 1) * 1024));
        }
        put(bits);
        break;
      }
      case DataType::kBytes:
        break;  // strings: see StringsInAndOut
    }
  }
  return out;
}

struct OwnedRequest {
  std::string bytes;
  InferRequest request;
};

std::unique_ptr<OwnedRequest> MakeRequest(DataType type, const std::vector<double>& values,
                                          Shape shape, std::string name = "INPUT__0") {
  auto owned = std::make_unique<OwnedRequest>();
  owned->bytes = Encode(type, values);
  owned->request.model_name = "m";
  owned->request.batch_size = shape.empty() ? 1 : shape[0];
  owned->request.inputs.push_back(
      {name, type, shape, owned->bytes.data(), owned->bytes.size(), {}});
  return owned;
}

class TorchBackendTest : public ::testing::Test {
 protected:
  std::unique_ptr<BackendFactory> factory_ = MakeTorchBackendFactory();
};

TEST_F(TorchBackendTest, ProbeReportsVersions) {
  RuntimeInfo info = ProbeRuntime();
  EXPECT_EQ(info.torch_version, "2.11.0");
  EXPECT_TRUE(info.cuda_built);
  EXPECT_EQ(info.cuda_runtime_version, "13.0");
  if (!info.cuda_usable) {
    EXPECT_FALSE(info.problem.empty());
  }
}

TEST_F(TorchBackendTest, EveryDatatypeRoundTrips) {
  const auto path = SaveModule("double", kDouble);
  for (DataType type : kAllDataTypes) {
    if (type == DataType::kBool) continue;   // bool + bool is logical or: covered below
    if (type == DataType::kBytes) continue;  // List[str]: covered below
    auto backend = factory_->Load(Spec(type, type), path, Device{});
    ASSERT_TRUE(backend.ok()) << backend.status();
    auto owned = MakeRequest(type, {1, 2, 3, 0}, {2, 2});
    auto response = testing::Run(**backend, owned->request);
    ASSERT_TRUE(response.ok()) << DataTypeName(type) << ": " << response.status();
    ASSERT_EQ(response->outputs.size(), 1u);
    const Tensor& out = response->outputs[0];
    EXPECT_EQ(out.name, "OUTPUT__0");
    EXPECT_EQ(out.dtype, type);
    EXPECT_THAT(out.shape, ElementsAre(2, 2));
    EXPECT_EQ(out.data, Encode(type, {2, 4, 6, 0})) << DataTypeName(type);
  }
}

TEST_F(TorchBackendTest, CudaGraphsOnACpuInstanceAreIgnoredWithOneWarningAndItServes) {
  ModelSpec spec = Spec(DataType::kFp32, DataType::kFp32);
  spec.cuda_graphs = true;
  auto backend = factory_->Load(spec, SaveModule("double", kDouble), Device{});
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_THAT((*backend)->Warnings(),
              ElementsAre("optimization.cuda.graphs is ignored: the instance runs on the CPU"));
  for (int i = 0; i < 5; ++i) {  // past the passes a GPU instance would capture after
    auto owned = MakeRequest(DataType::kFp32, {1, 2, 3, 0}, {2, 2});
    auto response = testing::Run(**backend, owned->request);
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_EQ(response->outputs[0].data, Encode(DataType::kFp32, {2, 4, 6, 0}));
  }
  spec.cuda_graphs = false;
  auto plain = factory_->Load(spec, SaveModule("double", kDouble), Device{});
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_THAT((*plain)->Warnings(), IsEmpty());
}

TEST_F(TorchBackendTest, BoolTensors) {
  const auto path = SaveModule("invert", "def forward(self, INPUT__0):\n    return ~INPUT__0\n");
  auto backend = factory_->Load(Spec(DataType::kBool, DataType::kBool), path, Device{});
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto owned = MakeRequest(DataType::kBool, {1, 0, 1}, {1, 3});
  auto response = testing::Run(**backend, owned->request);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->outputs[0].data, Encode(DataType::kBool, {0, 1, 0}));
}

TEST_F(TorchBackendTest, InputsBindByNameAndDictOutputsByKey) {
  const auto path = SaveModule("named", R"(
def forward(self, values: Tensor, counts: Tensor) -> Dict[str, Tensor]:
    return {"twice": counts * 2, "total": values + counts.float()}
)");
  ModelSpec spec;
  spec.name = "named";
  spec.max_batch_size = 4;
  // Declared in the other order than forward's arguments.
  spec.inputs = {{"counts", DataType::kInt64, {2}}, {"values", DataType::kFp32, {2}}};
  spec.outputs = {{"total", DataType::kFp32, {2}}, {"twice", DataType::kInt64, {2}}};
  auto backend = factory_->Load(spec, path, Device{});
  ASSERT_TRUE(backend.ok()) << backend.status();
  std::string counts = Encode(DataType::kInt64, {1, 2}),
              values = Encode(DataType::kFp32, {0.5, 1.5});
  InferRequest request;
  request.inputs = {{"counts", DataType::kInt64, {1, 2}, counts.data(), counts.size(), {}},
                    {"values", DataType::kFp32, {1, 2}, values.data(), values.size(), {}}};
  auto response = testing::Run(**backend, request);
  ASSERT_TRUE(response.ok()) << response.status();
  ASSERT_EQ(response->outputs.size(), 2u);
  EXPECT_EQ(response->outputs[0].name, "total");
  EXPECT_EQ(response->outputs[0].data, Encode(DataType::kFp32, {1.5, 3.5}));
  EXPECT_EQ(response->outputs[1].data, Encode(DataType::kInt64, {2, 4}));
  request.requested_outputs = {"twice"};
  response = testing::Run(**backend, request);
  ASSERT_TRUE(response.ok());
  ASSERT_EQ(response->outputs.size(), 1u);
  EXPECT_EQ(response->outputs[0].name, "twice");
}

TEST_F(TorchBackendTest, TupleOutputsBindByIndexSuffix) {
  const auto path = SaveModule("pair", R"(
def forward(self, INPUT__0):
    return INPUT__0 * 2.0, INPUT__0.sum(dim=1, keepdim=True)
)");
  ModelSpec spec = Spec(DataType::kFp32, DataType::kFp32, {3}, {1});
  spec.outputs = {{"OUTPUT__1", DataType::kFp32, {1}}, {"OUTPUT__0", DataType::kFp32, {3}}};
  auto backend = factory_->Load(spec, path, Device{});
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto owned = MakeRequest(DataType::kFp32, {1, 2, 3}, {1, 3});
  auto response = testing::Run(**backend, owned->request);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->outputs[0].name, "OUTPUT__1");
  EXPECT_EQ(response->outputs[0].data, Encode(DataType::kFp32, {6}));
  EXPECT_EQ(response->outputs[1].data, Encode(DataType::kFp32, {2, 4, 6}));
}

TEST_F(TorchBackendTest, EachTargetGetsItsRowsOfTheOutputsItAskedFor) {
  const auto path = SaveModule("pair", R"(
def forward(self, INPUT__0):
    return INPUT__0 * 2.0, INPUT__0.sum(dim=1, keepdim=True)
)");
  ModelSpec spec = Spec(DataType::kFp32, DataType::kFp32, {2}, {1});
  spec.outputs = {{"OUTPUT__0", DataType::kFp32, {2}}, {"OUTPUT__1", DataType::kFp32, {1}}};
  auto backend = factory_->Load(spec, path, Device{});
  ASSERT_TRUE(backend.ok()) << backend.status();
  // Three rows from two callers plus one padding row.
  auto owned = MakeRequest(DataType::kFp32, {1, 2, 3, 4, 5, 6, 0, 0}, {4, 2});
  owned->request.batch_size = 4;
  TensorSink first, second;
  const std::vector<std::string> only_sum = {"OUTPUT__1"};
  const std::vector<OutputTarget> targets = {{1, &only_sum, &first}, {2, nullptr, &second}};
  ASSERT_TRUE((*backend)->Execute(owned->request, targets).ok());
  ASSERT_EQ(first.outputs().size(), 1u);
  EXPECT_EQ(first.outputs()[0].name, "OUTPUT__1");
  EXPECT_THAT(first.outputs()[0].shape, ElementsAre(1, 1));
  EXPECT_EQ(first.outputs()[0].data, Encode(DataType::kFp32, {3}));
  ASSERT_EQ(second.outputs().size(), 2u);
  EXPECT_THAT(second.outputs()[0].shape, ElementsAre(2, 2));
  EXPECT_EQ(second.outputs()[0].data, Encode(DataType::kFp32, {6, 8, 10, 12}));
  EXPECT_EQ(second.outputs()[1].data, Encode(DataType::kFp32, {7, 11}));
  // Exactly the callers' bytes were written: no padding row, no output nobody asked for.
  EXPECT_EQ(first.bytes() + second.bytes(), 4u + 16u + 8u);
}

using testing::HoldingSink;

std::string HostBytes(const HeldTensor& tensor) {
  std::string bytes(tensor.byte_size(), '\0');
  EXPECT_TRUE(tensor.CopyToHost(bytes.data()).ok());
  return bytes;
}

const void* Address(const HeldTensor& tensor) {
  return dynamic_cast<const TorchHeldTensor&>(tensor).tensor().data_ptr();
}

// One held input: the whole tensor, as an ensemble's step request carries it.
InferRequest HeldRequest(std::shared_ptr<const HeldTensor> tensor) {
  InferRequest request;
  request.model_name = "m";
  request.batch_size = tensor->shape()[0];
  request.inputs.push_back({"INPUT__0",
                            tensor->dtype(),
                            tensor->shape(),
                            nullptr,
                            tensor->byte_size(),
                            {HeldRows{0, tensor}}});
  return request;
}

constexpr char kIdentity[] = R"(
def forward(self, INPUT__0):
    return INPUT__0
)";

// A target that takes outputs held gets the model's tensor itself, and the next model reads it
// in place: a model that returns its input hands on the very memory it was given.
TEST_F(TorchBackendTest, HeldOutputsPassToTheNextModelWithoutACopy) {
  auto doubler = factory_->Load(Spec(DataType::kFp32, DataType::kFp32),
                                SaveModule("double", kDouble), Device{});
  auto identity = factory_->Load(Spec(DataType::kFp32, DataType::kFp32),
                                 SaveModule("identity", kIdentity), Device{});
  ASSERT_TRUE(doubler.ok() && identity.ok());
  auto owned = MakeRequest(DataType::kFp32, {1, 2, 3, 4}, {2, 2});
  HoldingSink first;
  ASSERT_TRUE((*doubler)->Execute(owned->request, {{2, nullptr, &first}}).ok());
  ASSERT_EQ(first.held.size(), 1u);
  EXPECT_TRUE(first.bytes.outputs().empty());  // nothing brought to the host
  const HeldTensor& made = *first.held[0];
  EXPECT_THAT(made.shape(), ElementsAre(2, 2));
  EXPECT_EQ(made.device(), HeldTensor::kHost);
  EXPECT_EQ(made.copied_at_birth(), 0u);
  EXPECT_EQ(HostBytes(made), Encode(DataType::kFp32, {2, 4, 6, 8}));

  InferRequest next = HeldRequest(first.held[0]);
  HoldingSink second;
  ASSERT_TRUE((*identity)->Execute(next, {{2, nullptr, &second}}).ok());
  ASSERT_EQ(second.held.size(), 1u);
  EXPECT_EQ(Address(*second.held[0]), Address(made));
  EXPECT_EQ(second.held[0]->copied_at_birth(), 0u);
  EXPECT_EQ(first.ledger->on_device.load() + first.ledger->through_host.load(), 0u);

  // A caller's sink gets the bytes, as ever.
  TensorSink caller;
  ASSERT_TRUE((*doubler)->Execute(next, {{2, nullptr, &caller}}).ok());
  EXPECT_EQ(caller.outputs()[0].data, Encode(DataType::kFp32, {4, 8, 12, 16}));
}

// An output that is the caller's own bytes (a model returning its input) would not outlive the
// request: it is copied once before it is handed out held, and that copy is counted.
TEST_F(TorchBackendTest, AnOutputInTheRequestsBytesIsCopiedBeforeItIsHeld) {
  auto identity = factory_->Load(Spec(DataType::kFp32, DataType::kFp32),
                                 SaveModule("identity", kIdentity), Device{});
  ASSERT_TRUE(identity.ok());
  auto owned = MakeRequest(DataType::kFp32, {1, 2, 3, 4}, {2, 2});
  HoldingSink sink;
  ASSERT_TRUE((*identity)->Execute(owned->request, {{2, nullptr, &sink}}).ok());
  ASSERT_EQ(sink.held.size(), 1u);
  EXPECT_EQ(sink.held[0]->copied_at_birth(), 16u);
  EXPECT_NE(Address(*sink.held[0]), static_cast<const void*>(owned->bytes.data()));
  owned->bytes.assign(owned->bytes.size(), '\0');
  EXPECT_EQ(HostBytes(*sink.held[0]), Encode(DataType::kFp32, {1, 2, 3, 4}));
}

// One batch, two callers: a target that takes held outputs gets its rows held (a view of the
// batch's output), the other its rows as bytes.
TEST_F(TorchBackendTest, EachTargetGetsItsRowsHeldOrAsBytesAsItsSinkTakesThem) {
  auto doubler = factory_->Load(Spec(DataType::kFp32, DataType::kFp32),
                                SaveModule("double", kDouble), Device{});
  ASSERT_TRUE(doubler.ok());
  auto owned = MakeRequest(DataType::kFp32, {1, 2, 3, 4, 5, 6}, {3, 2});
  HoldingSink held;
  TensorSink bytes;
  ASSERT_TRUE(
      (*doubler)->Execute(owned->request, {{2, nullptr, &held}, {1, nullptr, &bytes}}).ok());
  ASSERT_EQ(held.held.size(), 1u);
  EXPECT_THAT(held.held[0]->shape(), ElementsAre(2, 2));
  EXPECT_EQ(HostBytes(*held.held[0]), Encode(DataType::kFp32, {2, 4, 6, 8}));
  ASSERT_EQ(bytes.outputs().size(), 1u);
  EXPECT_EQ(bytes.outputs()[0].data, Encode(DataType::kFp32, {10, 12}));
}

// A held tensor of another kind (not this runtime's) is read through the host.
class ForeignHeld final : public HeldTensor {
 public:
  explicit ForeignHeld(std::string bytes)
      : HeldTensor(DataType::kFp32, {1, 2}, bytes.size(), kHost), bytes_(std::move(bytes)) {}
  Status CopyToHost(char* to) const override {
    std::memcpy(to, bytes_.data(), bytes_.size());
    return absl::OkStatus();
  }

 private:
  const std::string bytes_;
};

// An assembled batch: bytes for some rows, held tensors for others (this runtime's gathered on
// its device, another's through the host), padding rows zero; each copy counted where it ran.
TEST_F(TorchBackendTest, HeldRowsOfAnAssembledBatchAreGatheredAndCounted) {
  auto doubler = factory_->Load(Spec(DataType::kFp32, DataType::kFp32),
                                SaveModule("double", kDouble), Device{});
  ASSERT_TRUE(doubler.ok());
  auto produced = MakeRequest(DataType::kFp32, {3, 4}, {1, 2});
  HoldingSink step;
  ASSERT_TRUE((*doubler)->Execute(produced->request, {{1, nullptr, &step}}).ok());  // [6, 8]
  auto ledger = std::make_shared<CopyLedger>();
  auto foreign = std::make_shared<ForeignHeld>(Encode(DataType::kFp32, {5, 5}));
  foreign->set_ledger(ledger);
  step.held[0]->set_ledger(ledger);

  // Row 0 bytes, row 1 ours, row 2 foreign, row 3 padding.
  std::string staging = Encode(DataType::kFp32, {1, 2, 0, 0, 0, 0, 0, 0});
  InferRequest batch;
  batch.model_name = "m";
  batch.batch_size = 4;
  batch.inputs.push_back({"INPUT__0",
                          DataType::kFp32,
                          {4, 2},
                          staging.data(),
                          staging.size(),
                          {HeldRows{1, step.held[0]}, HeldRows{2, foreign}}});
  TensorSink sink;
  ASSERT_TRUE((*doubler)->Execute(batch, {{3, nullptr, &sink}}).ok());
  EXPECT_EQ(sink.outputs()[0].data, Encode(DataType::kFp32, {2, 4, 12, 16, 10, 10}));
  EXPECT_EQ(ledger->on_device.load(), 2u * 8u);  // ours, and the foreign one once on the host
  EXPECT_EQ(ledger->through_host.load(), 8u);

  // Every row held: no bytes at all; the padding row is zero.
  batch.inputs[0].data = nullptr;
  TensorSink all_held;
  ASSERT_TRUE((*doubler)->Execute(batch, {{4, nullptr, &all_held}}).ok());
  EXPECT_EQ(all_held.outputs()[0].data, Encode(DataType::kFp32, {0, 0, 12, 16, 10, 10, 0, 0}));
}

TEST_F(TorchBackendTest, ConvolutionOnCpu) {
  auto backend = factory_->Load(testing::ConvSpec(),
                                testing::SaveModule("conv", testing::kConvSource), Device{});
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto conv = testing::MakeConvRequest();
  auto response = testing::Run(**backend, conv->request);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->outputs[0].data, testing::ExpectedConvOutput());
  // The pass's phases, from the clock on the CPU: the convolution is the forward pass.
  const std::optional<DevicePhases> phases = (*backend)->LastPhases();
  ASSERT_TRUE(phases.has_value());
  EXPECT_GT(phases->forward, Duration::zero());
  EXPECT_GE(phases->to_device, Duration::zero());
  EXPECT_GE(phases->to_host, Duration::zero());
}

TEST_F(TorchBackendTest, IntraOpThreadsApplyToTheInstanceThread) {
  ModelSpec spec = Spec(DataType::kFp32, DataType::kFp32);
  spec.intra_op_threads = 1;
  auto backend = factory_->Load(spec, SaveModule("double", kDouble), Device{});
  ASSERT_TRUE(backend.ok());
  int seen = 0;
  std::thread worker([&] {
    auto owned = MakeRequest(DataType::kFp32, {1}, {1, 1});
    ASSERT_TRUE(testing::Run(**backend, owned->request).ok());
    seen = at::get_num_threads();
  });
  worker.join();
  EXPECT_EQ(seen, 1);
}

TEST_F(TorchBackendTest, LoadFailures) {
  auto missing =
      factory_->Load(Spec(DataType::kFp32, DataType::kFp32), "/nonexistent/model.pt", Device{});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);

  const auto corrupt = std::filesystem::temp_directory_path() / "sluice_corrupt_model.pt";
  std::ofstream(corrupt) << "not a zip archive";
  auto bad = factory_->Load(Spec(DataType::kFp32, DataType::kFp32), corrupt, Device{});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(bad.status().message(), HasSubstr("cannot load"));
  EXPECT_LT(bad.status().message().size(), 1200u);  // the torch message is kept, truncated

  ModelSpec two_inputs = Spec(DataType::kFp32, DataType::kFp32);
  two_inputs.inputs.push_back({"INPUT__1", DataType::kFp32, {-1}});
  auto arity = factory_->Load(two_inputs, SaveModule("double", kDouble), Device{});
  EXPECT_EQ(arity.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(arity.status().message(),
              HasSubstr("forward() takes 1 input(s) (INPUT__0) but config.pbtxt declares 2"));

  ModelSpec unbindable = Spec(DataType::kFp32, DataType::kFp32);
  unbindable.inputs[0].name = "image";
  auto names = factory_->Load(unbindable, SaveModule("double", kDouble), Device{});
  EXPECT_THAT(names.status().message(),
              HasSubstr("cannot bind config inputs to forward(INPUT__0)"));
}

TEST_F(TorchBackendTest, ExceptionInForwardIsAStatusAndTheInstanceServesOn) {
  const auto path = SaveModule("throws", R"(
def forward(self, INPUT__0):
    assert bool((INPUT__0 >= 0).all()), "negative input is not allowed"
    return INPUT__0
)");
  auto backend = factory_->Load(Spec(DataType::kFp32, DataType::kFp32), path, Device{});
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto bad = MakeRequest(DataType::kFp32, {-1}, {1, 1});
  auto failed = testing::Run(**backend, bad->request);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(failed.status().message(), HasSubstr("negative input is not allowed"));
  auto good = MakeRequest(DataType::kFp32, {1}, {1, 1});
  EXPECT_TRUE(testing::Run(**backend, good->request).ok());
}

// The TorchScript interpreter rethrows an allocation failure inside a model as a plain
// std::runtime_error: it must still be RESOURCE_EXHAUSTED (the GPU proof kit does the same with
// 200 GiB on a GPU), and the instance must serve on.
TEST_F(TorchBackendTest, OutOfMemoryInsideAScriptedModelIsResourceExhausted) {
  const auto path = SaveModule("allocate", R"(
def forward(self, INPUT__0):
    buffer = torch.empty([int(INPUT__0[0]) // 4])
    return INPUT__0 + buffer[:1].long() * 0
)");
  auto backend = factory_->Load(Spec(DataType::kInt64, DataType::kInt64), path, Device{});
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto huge = MakeRequest(DataType::kInt64, {std::ldexp(1.0, 62)}, {1, 1});
  auto failed = testing::Run(**backend, huge->request);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kResourceExhausted) << failed.status();
  EXPECT_THAT(failed.status().message(), HasSubstr("out of memory"));
  EXPECT_FALSE(IsFatal(failed.status()));
  auto small = MakeRequest(DataType::kInt64, {1024.0}, {1, 1});
  EXPECT_TRUE(testing::Run(**backend, small->request).ok());
}

std::string Strings(const std::vector<std::string>& elements) {
  std::string out;
  for (const std::string& element : elements) AppendBytesElement(element, &out);
  return out;
}

constexpr char kStringModel[] = R"(
def forward(self, TEXT: List[str]) -> Tuple[Tensor, List[str]]:
    lengths = torch.tensor([len(s) for s in TEXT]).unsqueeze(1)
    return lengths, [s + "!" for s in TEXT]
)";

ModelSpec StringSpec() {
  ModelSpec spec;
  spec.name = "m";
  spec.max_batch_size = 8;
  spec.inputs = {{"TEXT", DataType::kBytes, {1}}};
  spec.outputs = {{"LENGTH", DataType::kInt64, {1}}, {"SHOUT", DataType::kBytes, {1}}};
  return spec;
}

TEST_F(TorchBackendTest, StringsInAndOut) {
  auto backend = factory_->Load(StringSpec(), SaveModule("strings", kStringModel), Device{});
  ASSERT_TRUE(backend.ok()) << backend.status();
  // Three rows from two callers and one padding row (an empty string): one flat List[str].
  const std::string bytes = Strings({"ab", "", "x\xc3\xa9", ""});
  InferRequest batch;
  batch.model_name = "m";
  batch.batch_size = 4;
  batch.inputs.push_back({"TEXT", DataType::kBytes, {4, 1}, bytes.data(), bytes.size(), {}});
  TensorSink first, second;
  const std::vector<std::string> only_shout = {"SHOUT"};
  const std::vector<OutputTarget> targets = {{1, &only_shout, &first}, {2, nullptr, &second}};
  ASSERT_TRUE((*backend)->Execute(batch, targets).ok());
  ASSERT_EQ(first.outputs().size(), 1u);
  EXPECT_EQ(first.outputs()[0].dtype, DataType::kBytes);
  EXPECT_THAT(first.outputs()[0].shape, ElementsAre(1, 1));
  EXPECT_EQ(first.outputs()[0].data, Strings({"ab!"}));
  ASSERT_EQ(second.outputs().size(), 2u);
  EXPECT_THAT(second.outputs()[0].shape, ElementsAre(2, 1));
  EXPECT_EQ(second.outputs()[0].data,
            Encode(DataType::kInt64, {0, 3}));  // TorchScript's len counts bytes
  EXPECT_THAT(second.outputs()[1].shape, ElementsAre(2, 1));
  EXPECT_EQ(second.outputs()[1].data, Strings({"!", "x\xc3\xa9!"}));
}

TEST_F(TorchBackendTest, StringsAndTensorsCannotStandInForEachOther) {
  // At load: the config's type against forward()'s argument type.
  ModelSpec tensor_config = StringSpec();
  tensor_config.inputs[0].dtype = DataType::kFp32;
  auto loaded = factory_->Load(tensor_config, SaveModule("strings", kStringModel), Device{});
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      loaded.status().message(),
      HasSubstr("input 'TEXT' is FP32 in config.pbtxt, but forward() takes 'TEXT' as List[str]"));
  ModelSpec string_config = StringSpec();
  string_config.inputs[0].name = "INPUT__0";
  loaded = factory_->Load(string_config, SaveModule("double", kDouble), Device{});
  EXPECT_THAT(loaded.status().message(),
              HasSubstr("input 'INPUT__0' is TYPE_STRING in config.pbtxt, but forward() takes "
                        "'INPUT__0' as Tensor"));

  // At run time: what the model returns against the declared outputs.
  const std::string bytes = Strings({"a", "b"});
  InferRequest request;
  request.model_name = "m";
  request.batch_size = 2;
  request.inputs.push_back({"TEXT", DataType::kBytes, {2, 1}, bytes.data(), bytes.size(), {}});
  struct Case {
    const char* source;
    const char* message;
  };
  for (const Case& c : std::vector<Case>{
           {"def forward(self, TEXT: List[str]):\n    return torch.tensor([[0], [0]]), "
            "torch.zeros(2, 1)\n",
            "returned a Tensor for output 'SHOUT', which config.pbtxt declares TYPE_STRING: return "
            "a List[str]"},
           {"def forward(self, TEXT: List[str]):\n    return torch.tensor([[0], [0]]), [1, 2]\n",
            "returned a list holding a Int for output 'SHOUT'"},
           {"def forward(self, TEXT: List[str]):\n    return torch.tensor([[0], [0]]), TEXT + TEXT "
            "+ TEXT\n",
            "returned 6 strings for output 'SHOUT', but config.pbtxt declares [-1,1] with batch "
            "size 2"},
           {"def forward(self, TEXT: List[str]):\n    return TEXT, TEXT\n",
            "returned a GenericList for output 'LENGTH', not a tensor (config.pbtxt declares "
            "INT64)"},
       }) {
    auto backend = factory_->Load(StringSpec(), SaveModule("wrong", c.source), Device{});
    ASSERT_TRUE(backend.ok()) << backend.status();
    const Status status = testing::Run(**backend, request).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << c.source;
    EXPECT_THAT(status.message(), HasSubstr(c.message)) << c.source;
  }
}

TEST_F(TorchBackendTest, OutputsDisagreeingWithConfigAreErrors) {
  {
    auto backend = factory_->Load(
        Spec(DataType::kFp32, DataType::kFp32),
        SaveModule("to_double", "def forward(self, INPUT__0):\n    return INPUT__0.double()\n"),
        Device{});
    ASSERT_TRUE(backend.ok());
    auto owned = MakeRequest(DataType::kFp32, {1}, {1, 1});
    EXPECT_THAT(
        testing::Run(**backend, owned->request).status().message(),
        HasSubstr("produced Double for output 'OUTPUT__0', but config.pbtxt declares FP32"));
  }
  {
    auto backend = factory_->Load(
        Spec(DataType::kFp32, DataType::kFp32, {-1}, {4}),
        SaveModule("same", "def forward(self, INPUT__0):\n    return INPUT__0\n"), Device{});
    ASSERT_TRUE(backend.ok());
    auto owned = MakeRequest(DataType::kFp32, {1, 2}, {1, 2});
    EXPECT_THAT(
        testing::Run(**backend, owned->request).status().message(),
        HasSubstr("produced shape [1,2] for output 'OUTPUT__0', but config.pbtxt declares [-1,4]"));
  }
  {
    auto backend = factory_->Load(
        Spec(DataType::kFp32, DataType::kFp32),
        SaveModule("number", "def forward(self, INPUT__0):\n    return 3\n"), Device{});
    ASSERT_TRUE(backend.ok());
    auto owned = MakeRequest(DataType::kFp32, {1}, {1, 1});
    EXPECT_THAT(testing::Run(**backend, owned->request).status().message(),
                HasSubstr("expected a tensor, a tuple/list or a dict of tensors"));
  }
}

}  // namespace
}  // namespace sluice
