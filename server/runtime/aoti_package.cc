#include "server/runtime/aoti_package.h"

#include <sys/statvfs.h>
#include <sys/utsname.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace sluice {
namespace {

using Json = nlohmann::json;

// AOTInductor compiles a dynamic dimension for sizes from 2 up, whatever lower bound the export
// declared (torch.export reports Dim(min=1) as [1, max], but the package's input check, which the
// server turns on, refuses 1: "dim value is too small ... expected it to be >= 2"). A dynamic
// batch therefore starts at 2, and lone requests are padded to it.
constexpr int64_t kSmallestDynamicSize = 2;

StatusOr<Json> ParseJson(const std::string& text, const std::string& what) {
  Json value = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded())
    return absl::InvalidArgumentError(absl::StrCat(what, " is not valid JSON: ", text));
  return value;
}

StatusOr<PackageDim> ParseDim(const Json& value, const std::string& what) {
  PackageDim dim;
  if (value.is_null()) {
    dim.known = false;
    return dim;
  }
  if (value.is_number_integer() && value.get<int64_t>() >= 0) {
    dim.min = dim.max = value.get<int64_t>();
    return dim;
  }
  if (value.is_array() && value.size() == 2 && value[0].is_number_integer() &&
      (value[1].is_number_integer() || value[1].is_null())) {
    dim.min = value[0].get<int64_t>();
    dim.max = value[1].is_null() ? -1 : value[1].get<int64_t>();
    if (dim.min >= 0 && (dim.max == -1 || dim.max >= dim.min)) return dim;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": a dimension must be a size, [min, max] or null, found ", value.dump()));
}

StatusOr<std::vector<PackageTensor>> ParseTensors(
    const std::map<std::string, std::string>& metadata, const std::string& key) {
  auto it = metadata.find(key);
  if (it == metadata.end())
    return absl::InvalidArgumentError(absl::StrCat("metadata has no ", key));
  SLUICE_ASSIGN_OR_RETURN(Json list, ParseJson(it->second, key));
  if (!list.is_array())
    return absl::InvalidArgumentError(absl::StrCat(key, " must be a JSON list"));
  std::vector<PackageTensor> tensors;
  for (const Json& entry : list) {
    const std::string what = absl::StrCat(key, "[", tensors.size(), "]");
    if (!entry.is_object() || !entry.contains("dtype") || !entry["dtype"].is_string() ||
        !entry.contains("shape") || !entry["shape"].is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " needs \"dtype\" and \"shape\": ", entry.dump()));
    }
    PackageTensor tensor;
    if (entry.contains("name") && entry["name"].is_string())
      tensor.name = entry["name"].get<std::string>();
    const std::string dtype = entry["dtype"].get<std::string>();
    std::optional<DataType> parsed = ParseDataTypeName(dtype);
    if (!parsed)
      return absl::InvalidArgumentError(absl::StrCat(what, ": unknown dtype '", dtype, "'"));
    tensor.dtype = *parsed;
    for (const Json& dim : entry["shape"]) {
      SLUICE_ASSIGN_OR_RETURN(PackageDim parsed_dim, ParseDim(dim, what));
      if (parsed_dim.known && !parsed_dim.fixed())
        parsed_dim.min = std::max<int64_t>(parsed_dim.min, kSmallestDynamicSize);
      tensor.shape.push_back(parsed_dim);
    }
    tensors.push_back(std::move(tensor));
  }
  return tensors;
}

std::string Get(const std::map<std::string, std::string>& metadata, const std::string& key) {
  auto it = metadata.find(key);
  return it == metadata.end() ? "" : it->second;
}

// "2.11.0+cu130" -> "2.11".
std::string MajorMinor(const std::string& version) {
  std::vector<std::string> parts = absl::StrSplit(version, absl::MaxSplits('.', 2));
  return parts.size() >= 2 ? absl::StrCat(parts[0], ".", parts[1]) : version;
}

// The CPU flags an inductor instruction-set name needs (see torch/_inductor/cpu_vec_isa.py), or
// nullopt for a name this server does not know.
std::optional<std::vector<std::string>> FlagsForIsa(const std::string& isa) {
  static const std::map<std::string, std::vector<std::string>> kFlags = {
      {"AVX2", {"avx2", "fma"}},
      {"AVX512", {"avx512f", "avx512dq", "avx512vl", "avx512bw"}},
      {"AVX512_VNNI", {"avx512_vnni"}},
      {"AVX512_BF16", {"avx512_bf16"}},
      {"AMX_TILE", {"amx_tile"}},
      {"AMX_FP16", {"amx_fp16"}},
      {"ASIMD", {"asimd"}},
      {"NEON", {"asimd"}},
      {"SVE256", {"sve"}},
  };
  auto it = kFlags.find(isa);
  if (it == kFlags.end()) return std::nullopt;
  return it->second;
}

std::string DimText(const PackageDim& dim) {
  if (!dim.known) return "?";
  if (dim.fixed()) return absl::StrCat(dim.min);
  return absl::StrCat(dim.min, "..", dim.max == -1 ? std::string("inf") : absl::StrCat(dim.max));
}

std::string ShapeText(const std::vector<PackageDim>& shape) {
  return absl::StrCat(
      "[",
      absl::StrJoin(shape, ",",
                    [](std::string* out, const PackageDim& dim) { out->append(DimText(dim)); }),
      "]");
}

// Each declared tensor's position among `names`, when every one is there; nullopt otherwise.
std::optional<std::vector<int>> PositionsByName(const std::vector<TensorSpec>& declared,
                                                const std::vector<std::string>& names) {
  std::vector<int> by_name;
  for (const TensorSpec& tensor : declared) {
    auto it = std::find(names.begin(), names.end(), tensor.name);
    if (tensor.name.empty() || it == names.end()) return std::nullopt;
    by_name.push_back(static_cast<int>(it - names.begin()));
  }
  return by_name;
}

// Binds declared tensors to `count` package positions: by name (`names`, then Triton's call names
// `call_names`), else suffix, else config order.
StatusOr<std::vector<int>> BindPositions(const std::vector<TensorSpec>& declared, size_t count,
                                         const std::vector<std::string>& names,
                                         const std::vector<std::string>& call_names,
                                         const std::string& what) {
  if (declared.size() != count) {
    return absl::InvalidArgumentError(
        absl::StrCat("the package ", what == "input" ? "takes " : "returns ", count, " ", what,
                     "(s) but config.pbtxt declares ", declared.size()));
  }
  if (auto by_name = PositionsByName(declared, names)) return *by_name;
  if (auto by_call = PositionsByName(declared, call_names)) return *by_call;
  if (auto by_suffix = PositionsBySuffix(declared, count)) return *by_suffix;
  std::vector<int> in_order;
  for (size_t i = 0; i < declared.size(); ++i) in_order.push_back(static_cast<int>(i));
  return in_order;
}

Status CheckTensor(const ModelSpec& spec, const TensorSpec& declared, const PackageTensor& package,
                   const std::string& what) {
  const std::string head = absl::StrCat(what, " '", declared.name, "'");
  if (package.dtype != declared.dtype) {
    return absl::InvalidArgumentError(absl::StrCat(head, " is ", DataTypeName(declared.dtype),
                                                   " in config.pbtxt but ",
                                                   DataTypeName(package.dtype), " in the package"));
  }
  const Shape expected = spec.FullShape(declared);
  if (expected.size() != package.shape.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(head, " has shape ", ShapeToString(expected),
                     " in config.pbtxt (batch dimension included) but ", ShapeText(package.shape),
                     " in the package"));
  }
  for (size_t d = spec.batches() ? 1 : 0; d < expected.size(); ++d) {
    const PackageDim& dim = package.shape[d];
    if (!dim.known) continue;
    const bool variable = expected[d] == -1;
    const bool fits =
        !variable && expected[d] >= dim.min && (dim.max == -1 || expected[d] <= dim.max);
    if ((variable && dim.fixed()) || (!variable && !fits)) {
      return absl::InvalidArgumentError(
          absl::StrCat(head, " dimension ", d, " is ",
                       variable ? std::string("variable (-1)") : absl::StrCat(expected[d]),
                       " in config.pbtxt but ", DimText(dim), " in the package (shape ",
                       ShapeText(package.shape), ")"));
    }
  }
  return absl::OkStatus();
}

// The batch dimension of a model that batches: the exported range against max_batch_size.
Status CheckBatch(const AotiPackageInfo& package, const ModelSpec& spec, AotiBinding* binding,
                  std::vector<std::string>* warnings) {
  if (!package.batched) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.pbtxt has max_batch_size ", spec.max_batch_size,
        " but the package was exported without a "
        "batch dimension (sluice.batch null): set max_batch_size 0, or export with a batch Dim"));
  }
  const std::string how =
      absl::StrCat("export with torch.export.Dim(\"batch\", min=1, max=", spec.max_batch_size,
                   ") on dimension 0 of every input and example inputs of batch 2 or more");
  if (package.batch_max == 1 && package.batch_min == 1) {
    if (spec.max_batch_size > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the package was exported with its batch fixed to 1 but config.pbtxt has max_batch_size ",
          spec.max_batch_size, ": set max_batch_size 1 to serve it without batching, or ", how));
    }
    warnings->push_back(
        absl::StrCat("the package was exported with its batch fixed to 1, so requests never "
                     "batch: ",
                     how));
  }
  if (package.batch_max != -1 && spec.max_batch_size > package.batch_max) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.pbtxt has max_batch_size ", spec.max_batch_size,
                     " but the package's batch dimension ends at ", package.batch_max,
                     ": lower max_batch_size, or ", how));
  }
  if (package.batch_min > 1) {
    if (package.batch_min > spec.max_batch_size) {
      return absl::InvalidArgumentError(absl::StrCat("the package's smallest batch is ",
                                                     package.batch_min, ", above max_batch_size ",
                                                     spec.max_batch_size, ": ", how));
    }
    // Every dynamic batch starts at 2 (kSmallestDynamicSize): only a higher start deserves a word.
    binding->pad_batch_to = package.batch_min;
    if (package.batch_min > kSmallestDynamicSize) {
      warnings->push_back(absl::StrCat("the package's smallest batch is ", package.batch_min,
                                       ": smaller batches are "
                                       "padded to it (the padding rows are computed and dropped); ",
                                       how));
    }
  }
  return absl::OkStatus();
}

}  // namespace

StatusOr<AotiPackageInfo> ParseAotiMetadata(const std::map<std::string, std::string>& metadata) {
  AotiPackageInfo info;
  info.device_key = Get(metadata, "AOTI_DEVICE_KEY");
  info.machine = Get(metadata, "AOTI_MACHINE");
  for (absl::string_view isa :
       absl::StrSplit(Get(metadata, "AOTI_CPU_ISA"), ' ', absl::SkipEmpty())) {
    info.cpu_isa.push_back(absl::AsciiStrToUpper(isa));
  }
  info.compute_capability = Get(metadata, "AOTI_COMPUTE_CAPABILITY");
  if (!metadata.count("sluice.format")) return info;
  if (Get(metadata, "sluice.format") != "1") {
    return absl::InvalidArgumentError(absl::StrCat(
        "sluice.format '", Get(metadata, "sluice.format"), "' is not one this server reads (1)"));
  }
  info.described = true;
  info.torch_version = Get(metadata, "sluice.torch_version");
  SLUICE_ASSIGN_OR_RETURN(Json batch, ParseJson(Get(metadata, "sluice.batch"), "sluice.batch"));
  if (!batch.is_null()) {
    SLUICE_ASSIGN_OR_RETURN(PackageDim dim, ParseDim(batch, "sluice.batch"));
    if (!dim.known || dim.min < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("sluice.batch must be [min >= 1, max] or null: ", batch.dump()));
    }
    info.batched = true;
    info.batch_min = dim.fixed() ? dim.min : std::max<int64_t>(dim.min, kSmallestDynamicSize);
    info.batch_max = dim.max;
  }
  SLUICE_ASSIGN_OR_RETURN(info.inputs, ParseTensors(metadata, "sluice.inputs"));
  SLUICE_ASSIGN_OR_RETURN(info.outputs, ParseTensors(metadata, "sluice.outputs"));
  return info;
}

std::set<std::string> ParseCpuFlags(const std::string& cpuinfo) {
  std::istringstream lines(cpuinfo);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key(absl::StripAsciiWhitespace(line.substr(0, colon)));
    if (key != "flags" && key != "Features") continue;
    std::set<std::string> flags;
    for (absl::string_view flag : absl::StrSplit(line.substr(colon + 1), ' ', absl::SkipEmpty())) {
      flags.insert(std::string(flag));
    }
    return flags;
  }
  return {};
}

AotiHost ProbeAotiHost(std::string torch_version,
                       std::map<int, std::string> gpu_compute_capabilities) {
  AotiHost host;
  host.torch_version = std::move(torch_version);
  host.gpu_compute_capabilities = std::move(gpu_compute_capabilities);
  utsname name{};
  if (uname(&name) == 0) host.machine = name.machine;
  std::ifstream file("/proc/cpuinfo");
  std::stringstream text;
  text << file.rdbuf();
  host.cpu_flags = ParseCpuFlags(text.str());
  return host;
}

Status CheckPackageHost(const AotiPackageInfo& package, const Device& device, const AotiHost& host,
                        std::vector<std::string>* warnings) {
  const std::string here = device.cuda ? "cuda" : "cpu";
  if (!package.device_key.empty() && package.device_key != here) {
    return absl::FailedPreconditionError(
        absl::StrCat("the package was compiled for ", package.device_key,
                     " but this instance runs on ", device.ToString(), ": export one with device ",
                     here, " (model.", here, ".pt2 beside model.pt2 is chosen for ", here,
                     " instances), or set the instance_group kind to match"));
  }
  if (!package.described || package.torch_version.empty()) {
    // Without the recipe's metadata the torch version is unknown; the loader finds out.
  } else if (MajorMinor(package.torch_version) != MajorMinor(host.torch_version)) {
    return absl::FailedPreconditionError(
        absl::StrCat("the package was compiled by torch ", package.torch_version,
                     " but this server runs LibTorch ", host.torch_version,
                     ": AOTInductor packages load only into the torch release that compiled them; "
                     "recompile it with torch ",
                     MajorMinor(host.torch_version)));
  }
  if (device.cuda) {
    auto it = host.gpu_compute_capabilities.find(device.index);
    if (!package.compute_capability.empty() && it != host.gpu_compute_capabilities.end() &&
        it->second != package.compute_capability) {
      return absl::FailedPreconditionError(
          absl::StrCat("the package was compiled for GPU architecture sm_",
                       package.compute_capability, " but GPU ", device.index, " is sm_", it->second,
                       ": compile it on (or for) this GPU's architecture"));
    }
    return absl::OkStatus();
  }
  if (!package.machine.empty() && !host.machine.empty() && package.machine != host.machine) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the package was compiled for ", package.machine, " but this host is ", host.machine));
  }
  for (const std::string& isa : package.cpu_isa) {
    std::optional<std::vector<std::string>> flags = FlagsForIsa(isa);
    if (!flags) {
      warnings->push_back(
          absl::StrCat("the package uses CPU instruction set ", isa,
                       ", which this server cannot check; it runs if the CPU has it"));
      continue;
    }
    std::vector<std::string> missing;
    for (const std::string& flag : *flags) {
      if (!host.cpu_flags.count(flag)) missing.push_back(flag);
    }
    if (!missing.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("the package was compiled for CPU instruction set ", isa,
                       " but this CPU lacks ", absl::StrJoin(missing, ", "),
                       " (running it would crash the server): compile it on a machine "
                       "like this one, or for a common instruction set (TORCHINDUCTOR_CPP_ISA / "
                       "torch._inductor.config)"));
    }
  }
  return absl::OkStatus();
}

StatusOr<ModelDescription> DescribePackage(const AotiPackageInfo& package,
                                           const std::string& file) {
  if (!package.described) {
    return absl::FailedPreconditionError(absl::StrCat(
        file,
        " has no Sluice metadata (sluice.*), and LibTorch's loader cannot tell a package's "
        "inputs and outputs: declare them in config.pbtxt, or export the model with "
        "models/sluice_export.py"));
  }
  ModelDescription description;
  description.platform = kTorchAotiPlatform;
  description.batched = package.batched;
  description.batch_max = package.batched ? package.batch_max : -1;
  // Inputs by the recipe's names (forward's argument names, which bind by name); outputs by
  // Triton's ordinal names (the recipe's are graph node names, "add_1").
  auto convert = [&package](const std::vector<PackageTensor>& tensors, bool outputs) {
    std::vector<DescribedTensor> described;
    for (const PackageTensor& tensor : tensors) {
      DescribedTensor out{
          outputs ? absl::StrCat("OUTPUT__", described.size()) : tensor.name, tensor.dtype, {}};
      for (size_t i = package.batched ? 1 : 0; i < tensor.shape.size(); ++i)
        out.dims.push_back(tensor.shape[i].fixed() ? tensor.shape[i].min : -1);
      described.push_back(std::move(out));
    }
    return described;
  };
  description.inputs = convert(package.inputs, false);
  description.outputs = convert(package.outputs, true);
  return description;
}

StatusOr<AotiBinding> BindAotiPackage(const AotiPackageInfo& package, const CallSpecSide& in,
                                      const CallSpecSide& out, const ModelSpec& spec,
                                      std::vector<std::string>* warnings) {
  const size_t package_inputs = in.leaves;
  const size_t package_outputs = out.leaves;
  const std::vector<std::string>& output_keys = out.keys;
  std::vector<std::string> input_names = in.keys;
  input_names.resize(package_inputs);
  if (package.described) {
    if (package.inputs.size() != package_inputs || package.outputs.size() != package_outputs) {
      return absl::InvalidArgumentError(
          absl::StrCat("the package's metadata lists ", package.inputs.size(), " input(s) and ",
                       package.outputs.size(), " output(s) but its call takes ", package_inputs,
                       " and returns ", package_outputs));
    }
    for (size_t i = 0; i < package_inputs; ++i) {
      if (input_names[i].empty()) input_names[i] = package.inputs[i].name;
    }
  }
  SLUICE_ASSIGN_OR_RETURN(std::vector<int> input_positions,
                          BindPositions(spec.inputs, package_inputs, input_names,
                                        TritonCallNames(in, /*inputs=*/true), "input"));
  std::vector<std::string> output_names = output_keys;
  output_names.resize(package_outputs);
  const bool returns_dict = std::any_of(output_keys.begin(), output_keys.end(),
                                        [](const std::string& key) { return !key.empty(); });
  const std::vector<std::string> output_call_names = TritonCallNames(out, /*inputs=*/false);
  SLUICE_ASSIGN_OR_RETURN(
      std::vector<int> output_positions,
      BindPositions(spec.outputs, package_outputs, output_names, output_call_names, "output"));
  if (returns_dict) {
    // A dict's values are named: by key, by call name or by ordinal, never bound by config order.
    for (size_t i = 0; i < spec.outputs.size(); ++i) {
      const std::string& name = spec.outputs[i].name;
      const size_t position = static_cast<size_t>(output_positions[i]);
      const std::optional<int> ordinal = IndexSuffix(name);
      if (output_names[position] != name && output_call_names[position] != name &&
          !(ordinal && static_cast<size_t>(*ordinal) == position)) {
        std::vector<std::string> keys;
        for (const std::string& key : output_keys) {
          if (!key.empty()) keys.push_back(key);
        }
        return absl::InvalidArgumentError(absl::StrCat(
            "the package returns a dict with keys ", absl::StrJoin(keys, ", "),
            " (its outputs by Triton's names: ", absl::StrJoin(output_call_names, ", "),
            ") but config.pbtxt declares output '", name, "'"));
      }
    }
  }
  AotiBinding binding;
  binding.input_package_index = input_positions;
  binding.output_package_index = output_positions;
  if (!package.described) {
    // Without the recipe's metadata the batch range is unknown; a dynamic batch starts at 2, so
    // lone requests are padded to 2 unless the model takes batches of 1 only.
    if (spec.batches() && spec.max_batch_size > 1) binding.pad_batch_to = kSmallestDynamicSize;
    warnings->push_back(
        "the package has no Sluice metadata (sluice.*): its inputs are checked only by warm-up; "
        "export it with models/sluice_export.py to have the config checked at load");
    return binding;
  }
  if (!spec.batches()) {
    if (package.batched) {
      return absl::InvalidArgumentError(
          "config.pbtxt has max_batch_size 0 (no batch dimension) but the package was exported "
          "with one "
          "(sluice.batch): set max_batch_size, or export without a batch dimension");
    }
  } else {
    SLUICE_RETURN_IF_ERROR(CheckBatch(package, spec, &binding, warnings));
  }
  for (size_t i = 0; i < spec.inputs.size(); ++i) {
    SLUICE_RETURN_IF_ERROR(
        CheckTensor(spec, spec.inputs[i], package.inputs[input_positions[i]], "input"));
  }
  for (size_t i = 0; i < spec.outputs.size(); ++i) {
    const PackageTensor& output = package.outputs[output_positions[i]];
    if (output.dtype != spec.outputs[i].dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          "output '", spec.outputs[i].name, "' is ", DataTypeName(spec.outputs[i].dtype),
          " in config.pbtxt but ", DataTypeName(output.dtype), " in the package"));
    }
  }
  return binding;
}

std::string PackageFileFor(const std::string& file, const Device& device) {
  const std::filesystem::path path(file);
  const std::filesystem::path specific =
      path.parent_path() /
      absl::StrCat(path.stem().string(), device.cuda ? ".cuda" : ".cpu", path.extension().string());
  std::error_code ec;
  return std::filesystem::is_regular_file(specific, ec) ? specific.string() : file;
}

StatusOr<CallSpecSide> ParseCallSpec(const std::string& treespec_json) {
  SLUICE_ASSIGN_OR_RETURN(Json spec, ParseJson(treespec_json, "the call spec"));
  // [protocol, node]; node: {"type": null | "builtins.tuple" | ..., "context": JSON text,
  // "children_spec": [...]}
  if (!spec.is_array() || spec.size() != 2 || !spec[1].is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("unexpected call spec: ", treespec_json));
  }
  CallSpecSide side;
  // Appends the leaves under `node`; `key` names the node when a dict holds it, `path` is its
  // place from the root.
  std::function<Status(const Json&, const std::string&, const std::string&)> walk =
      [&](const Json& node, const std::string& key, const std::string& path) -> Status {
    if (!node.is_object() || !node.contains("children_spec") || !node["children_spec"].is_array()) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected call spec node: ", node.dump()));
    }
    const Json& children = node["children_spec"];
    if (node.value("type", Json()).is_null() && children.empty()) {
      ++side.leaves;
      side.keys.push_back(key);
      side.paths.push_back(path);
      return absl::OkStatus();
    }
    std::vector<std::string> child_keys(children.size());
    const std::string type =
        node.value("type", Json()).is_string() ? node["type"].get<std::string>() : "";
    const Json context = node.value("context", Json());
    if ((type == "builtins.dict" || type == "collections.OrderedDict") && context.is_string()) {
      Json keys = Json::parse(context.get<std::string>(), nullptr, false);
      if (keys.is_array() && keys.size() == children.size()) {
        for (size_t i = 0; i < keys.size(); ++i) {
          if (keys[i].is_string()) child_keys[i] = keys[i].get<std::string>();
        }
      }
    }
    for (size_t i = 0; i < children.size(); ++i) {
      const std::string accessor = child_keys[i].empty() ? absl::StrCat(i) : child_keys[i];
      SLUICE_RETURN_IF_ERROR(
          walk(children[i], child_keys[i], absl::StrCat(path, "[", accessor, "]")));
    }
    return absl::OkStatus();
  };
  SLUICE_RETURN_IF_ERROR(walk(spec[1], "", ""));
  return side;
}

std::vector<std::string> TritonCallNames(const CallSpecSide& side, bool inputs) {
  std::vector<std::string> names;
  names.reserve(side.paths.size());
  for (const std::string& path : side.paths) {
    if (!inputs) {
      names.push_back("RESULT" + path);
    } else if (absl::StartsWith(path, "[0]")) {
      names.push_back("ARGS" + path.substr(3));
    } else if (absl::StartsWith(path, "[1]")) {
      names.push_back("KWARGS" + path.substr(3));
    } else {
      names.push_back("");  // not the (args, kwargs) pair a call spec's input side is
    }
  }
  return names;
}

}  // namespace sluice

namespace sluice {

std::string AotiUnpackDirectory() {
  // The variables std::filesystem::temp_directory_path reads, in its order (libstdc++), without
  // its check that the directory exists: a missing one is what CheckUnpackDirectory reports.
  for (const char* name : {"TMPDIR", "TMP", "TEMP", "TEMPDIR"}) {
    const char* value = std::getenv(name);
    if (value != nullptr && *value != '\0') return value;
  }
  return "/tmp";
}

UnpackDirectoryState StatUnpackDirectory(const std::string& directory) {
  UnpackDirectoryState state;
  struct statvfs info {};
  if (statvfs(directory.c_str(), &info) != 0) {
    state.exists = false;
    return state;
  }
  state.read_only = (info.f_flag & ST_RDONLY) != 0;
  state.noexec = (info.f_flag & ST_NOEXEC) != 0;
  return state;
}

Status CheckUnpackDirectory(const std::string& directory, const UnpackDirectoryState& state) {
  constexpr const char* kHow =
      "AOTInductor packages unpack their shared libraries into the temporary directory ($TMPDIR, "
      "else "
      "/tmp) and load them from there";
  if (!state.exists) {
    return absl::FailedPreconditionError(absl::StrCat(kHow, ", and ", directory,
                                                      " does not exist: create it, or set "
                                                      "TMPDIR to a writable directory"));
  }
  if (state.read_only) {
    return absl::FailedPreconditionError(
        absl::StrCat(kHow, ", and ", directory,
                     " is on a read-only file system: give it a writable mount (docker run "
                     "--read-only --tmpfs /tmp:exec; in Kubernetes an emptyDir volume), or set "
                     "TMPDIR to a writable directory"));
  }
  if (state.noexec) {
    return absl::FailedPreconditionError(
        absl::StrCat(kHow, ", and ", directory,
                     " is mounted noexec, so they cannot be loaded: mount it with exec (docker "
                     "run --tmpfs /tmp:exec; Docker's --tmpfs is noexec unless told otherwise), or "
                     "set TMPDIR to a "
                     "directory that allows it"));
  }
  return absl::OkStatus();
}

}  // namespace sluice
