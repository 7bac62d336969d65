#include "server/runtime/aoti_backend.h"

#include <ATen/Functions.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace sluice {
namespace {

// Building two loaders at once corrupts memory (pytorch/pytorch#194128): one at a time.
Mutex& LoaderConstruction() {
  static Mutex* mutex = new Mutex();
  return *mutex;
}

// One loaded package on one device, shared by that device's instances.
struct LoadedPackage {
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader;
  AotiBinding binding;
};

// Whether the archive holds a compiled model; a package_cpp_only package holds sources only and
// would need a compiler at load time.
Status CheckCompiled(const std::string& file) {
  caffe2::serialize::PyTorchStreamReader reader(file);
  const std::vector<std::string> records = reader.getAllRecords();
  const bool compiled = std::any_of(records.begin(), records.end(), [](const std::string& record) {
    return absl::EndsWith(record, ".so");
  });
  if (compiled) return absl::OkStatus();
  return absl::FailedPreconditionError(
      "the package holds no compiled library (exported with package_cpp_only?): the server does "
      "not compile "
      "packages; export it without package_cpp_only");
}

class AotiBackend final : public TorchInstance {
 public:
  AotiBackend(const ModelSpec& spec, std::shared_ptr<LoadedPackage> package, at::Device device,
              std::shared_ptr<StreamRecycler> streams, std::vector<std::string> warnings)
      : TorchInstance(spec, device, std::move(streams)),
        package_(std::move(package)),
        warnings_(std::move(warnings)) {}

  // No graph to rewrite: the cuDNN decision line says how packages take the flag
  // (DecideCudnnBenchmark).
  std::vector<std::string> Warnings() const override {
    std::vector<std::string> warnings = TorchInstance::Warnings();
    warnings.insert(warnings.end(), warnings_.begin(), warnings_.end());
    return warnings;
  }

 private:
  StatusOr<std::vector<c10::IValue>> Forward(std::vector<c10::IValue> declared,
                                             const InferRequest& request) override {
    const AotiBinding& binding = package_->binding;
    // A batch below the package's smallest is padded with zero rows; their outputs are dropped.
    const int64_t padded_rows =
        spec().batches() && request.batch_size < binding.pad_batch_to ? binding.pad_batch_to : 0;
    std::vector<at::Tensor> inputs(binding.input_package_index.size());
    for (size_t i = 0; i < declared.size(); ++i) {
      if (!declared[i].isTensor()) continue;
      at::Tensor tensor = declared[i].toTensor();
      if (padded_rows > 0) {
        std::vector<int64_t> shape = tensor.sizes().vec();
        shape[0] = padded_rows;
        at::Tensor padded = at::zeros(shape, tensor.options());
        padded.narrow(0, 0, tensor.size(0)).copy_(tensor);
        tensor = padded;
      }
      inputs[binding.input_package_index[i]] = std::move(tensor);
    }
    void* stream_handle = stream() != nullptr ? static_cast<void*>(stream()->stream()) : nullptr;
    std::vector<at::Tensor> flat = package_->loader->run(inputs, stream_handle);
    std::vector<c10::IValue> outputs;
    outputs.reserve(spec().outputs.size());
    for (int index : binding.output_package_index) {
      if (static_cast<size_t>(index) >= flat.size()) {
        return absl::InternalError(
            absl::StrCat("model '", spec().name, "' returned ", flat.size(), " tensors"));
      }
      at::Tensor output = flat[index];
      if (padded_rows > 0 && output.dim() > 0 && output.size(0) == padded_rows) {
        output = output.narrow(0, 0, request.batch_size);
      }
      outputs.push_back(std::move(output));
    }
    return outputs;
  }

  const std::shared_ptr<LoadedPackage> package_;
  const std::vector<std::string> warnings_;
};

std::map<std::string, std::string> Ordered(
    const std::unordered_map<std::string, std::string>& map) {
  return std::map<std::string, std::string>(map.begin(), map.end());
}

}  // namespace

namespace {

class PackageDescriber final : public ModelDescriber {
 public:
  StatusOr<ModelDescription> Describe(const std::filesystem::path& file) const override {
    return CatchTorch(
        absl::StrCat("cannot read ", file.string()), [&]() -> StatusOr<ModelDescription> {
          SLUICE_RETURN_IF_ERROR(CheckCompiled(file.string()));
          SLUICE_ASSIGN_OR_RETURN(
              const AotiPackageInfo info,
              ParseAotiMetadata(
                  Ordered(torch::inductor::AOTIModelPackageLoader::load_metadata_from_package(
                      file.string(), "model"))));
          return DescribePackage(info, file.filename().string());
        });
  }
};

}  // namespace

std::unique_ptr<ModelDescriber> MakePackageDescriber() {
  return std::make_unique<PackageDescriber>();
}

void EnableAotiInputChecks() { setenv("AOTI_RUNTIME_CHECK_INPUTS", "1", /*overwrite=*/1); }

StatusOr<std::vector<std::unique_ptr<ModelBackend>>> LoadAotiInstances(
    const ModelSpec& spec, const std::filesystem::path& file, const Device& device, int count,
    const AotiHost& host, std::shared_ptr<StreamRecycler> streams) {
  const std::string package_file = PackageFileFor(file.string(), device);
  std::error_code ec;
  if (!std::filesystem::is_regular_file(package_file, ec)) {
    return absl::NotFoundError(absl::StrCat("model file ", file.string(), " does not exist (nor ",
                                            file.stem().string(), device.cuda ? ".cuda" : ".cpu",
                                            file.extension().string(), " beside it)"));
  }
  return CatchTorch(
      absl::StrCat("cannot load ", package_file),
      [&]() -> StatusOr<std::vector<std::unique_ptr<ModelBackend>>> {
        SLUICE_RETURN_IF_ERROR(CheckCompiled(package_file));
        SLUICE_ASSIGN_OR_RETURN(
            AotiPackageInfo info,
            ParseAotiMetadata(
                Ordered(torch::inductor::AOTIModelPackageLoader::load_metadata_from_package(
                    package_file, "model"))));
        std::vector<std::string> warnings;
        // Before any of the package's code is loaded: a package for another CPU would crash here.
        SLUICE_RETURN_IF_ERROR(CheckPackageHost(info, device, host, &warnings));
        const std::string unpack_directory = AotiUnpackDirectory();
        SLUICE_RETURN_IF_ERROR(
            CheckUnpackDirectory(unpack_directory, StatUnpackDirectory(unpack_directory)));
        auto package = std::make_shared<LoadedPackage>();
        {
          MutexLock lock(&LoaderConstruction());
          package->loader = std::make_unique<torch::inductor::AOTIModelPackageLoader>(
              package_file, "model", /*run_single_threaded=*/false, static_cast<size_t>(count),
              device.cuda ? static_cast<c10::DeviceIndex>(device.index)
                          : static_cast<c10::DeviceIndex>(-1));
        }
        const std::vector<std::string> call_spec = package->loader->get_call_spec();
        if (call_spec.size() != 2)
          return absl::InternalError("the package's call spec has no in/out spec");
        SLUICE_ASSIGN_OR_RETURN(CallSpecSide in, ParseCallSpec(call_spec[0]));
        SLUICE_ASSIGN_OR_RETURN(CallSpecSide out, ParseCallSpec(call_spec[1]));
        SLUICE_ASSIGN_OR_RETURN(package->binding, BindAotiPackage(info, in, out, spec, &warnings));
        const at::Device torch_device = ToTorchDevice(device);
        std::vector<std::unique_ptr<ModelBackend>> instances;
        for (int i = 0; i < count; ++i) {
          instances.push_back(
              std::make_unique<AotiBackend>(spec, package, torch_device, streams, warnings));
        }
        return instances;
      });
}

}  // namespace sluice
