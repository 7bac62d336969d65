// What an AOTInductor package (.pt2) says about itself, and whether it can serve a model here.
// Torch-free: the checks are plain functions of the package's metadata map, the model's config
// and facts about this host, so they are unit-tested without compiling a package.
//
// The metadata comes from two writers. Inductor writes AOTI_DEVICE_KEY ("cpu" or "cuda"),
// AOTI_MACHINE ("x86_64"), AOTI_CPU_ISA ("AVX512 AVX512_VNNI") and AOTI_COMPUTE_CAPABILITY
// ("90") into every package. Sluice's export recipe (models/sluice_export.py, see
// docs/guide/model-repository.md) adds what the 2.11 loader cannot tell: the version of torch that
// compiled it and each input's and output's dtype and shape with the batch range, as JSON values:
//   sluice.format          "1"
//   sluice.torch_version   "2.11.0+cu130"
//   sluice.batch           [min, max] of the batch dimension (dimension 0 of every input and
//                          output), or null when the model has none
//   sluice.inputs          [{"name": "x", "dtype": "FP32", "shape": [[1, 64], 784]}, ...] in the
//   sluice.outputs         package's flat order; a dimension is a size, [min, max] when it is
//                          dynamic (max null: unbounded), or null when not known
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "server/core/data_type.h"
#include "server/core/device.h"
#include "server/core/model_description.h"
#include "server/core/model_spec.h"
#include "server/core/status.h"

namespace sluice {

// One dimension of a package tensor: fixed (min == max), dynamic in [min, max] (max -1:
// unbounded), or unknown (an expression the recipe could not write down).
struct PackageDim {
  int64_t min = 0;
  int64_t max = -1;
  bool known = true;
  bool fixed() const { return known && min == max; }
};

struct PackageTensor {
  std::string name;
  DataType dtype = DataType::kFp32;
  std::vector<PackageDim> shape;
};

struct AotiPackageInfo {
  // Written by inductor (empty when absent).
  std::string device_key;            // "cpu" or "cuda"
  std::string machine;               // "x86_64"
  std::vector<std::string> cpu_isa;  // {"AVX512", "AVX512_VNNI"}
  std::string compute_capability;    // "90"
  // Written by the export recipe; `described` is false when the package has none of it.
  bool described = false;
  std::string torch_version;
  bool batched = false;
  int64_t batch_min = 1, batch_max = -1;  // when batched (-1: unbounded)
  std::vector<PackageTensor> inputs, outputs;
};

// INVALID_ARGUMENT naming the key when a sluice.* value does not parse.
StatusOr<AotiPackageInfo> ParseAotiMetadata(const std::map<std::string, std::string>& metadata);

// What the server runs on, as far as packages care.
struct AotiHost {
  std::string torch_version;        // LibTorch's, "2.11.0+cu130"
  std::string machine;              // uname -m
  std::set<std::string> cpu_flags;  // /proc/cpuinfo's flags (x86) or Features (Arm)
  std::map<int, std::string> gpu_compute_capabilities;  // GPU index -> "90"
};
// Reads uname and /proc/cpuinfo; the torch version and GPUs come from the caller's probe.
AotiHost ProbeAotiHost(std::string torch_version,
                       std::map<int, std::string> gpu_compute_capabilities);
// The flags of one /proc/cpuinfo text (the first processor's "flags" or "Features" line).
std::set<std::string> ParseCpuFlags(const std::string& cpuinfo);

// Checks a package against the instance's device and this host: device kind, machine, CPU
// instruction sets (an AVX-512 package on a CPU without AVX-512 would kill the process at its
// first run), GPU architecture and torch version. FAILED_PRECONDITION naming the mismatch and
// what to do. Unknown instruction-set names are not refused; they come back in `warnings`.
Status CheckPackageHost(const AotiPackageInfo& package, const Device& device, const AotiHost& host,
                        std::vector<std::string>* warnings);

// A package's call spec (torch.utils._pytree treespec JSON, AOTIModelPackageLoader::
// get_call_spec): how many tensors it takes or returns, flat, the key of each where the
// structure names them (keyword arguments; a returned dict), else "", and the path of each from
// the root: "[i]" for an element of a tuple or list, "[key]" for a dict's value ("[0][2][keyA]";
// "" for a root that is itself the one tensor).
struct CallSpecSide {
  size_t leaves = 0;
  std::vector<std::string> keys;   // one per leaf
  std::vector<std::string> paths;  // one per leaf
};
StatusOr<CallSpecSide> ParseCallSpec(const std::string& treespec_json);

// The names Triton's PyTorch backend (26.05 and later) gives a package's flat inputs and outputs
// by their place in the call: inputs "ARGS[i]..." (positional) and "KWARGS[name]..." (keyword;
// the input side's root is the (args, kwargs) pair), outputs "RESULT" (one tensor), "RESULT[i]...",
// "RESULT[key]...". One per leaf, in flat order.
std::vector<std::string> TritonCallNames(const CallSpecSide& side, bool inputs);

// What a package described by the export recipe's metadata serves, for completing a
// configuration (core/model_description.h): each tensor's name, dtype and dims after the batch
// (-1 where dynamic or unknown), the batch range. FAILED_PRECONDITION naming `file` and what to
// do when the package has no such metadata.
StatusOr<ModelDescription> DescribePackage(const AotiPackageInfo& package, const std::string& file);

// How a package's flat inputs and outputs bind to the config's, once checked.
struct AotiBinding {
  std::vector<int> input_package_index;   // per config input: the package input it is
  std::vector<int> output_package_index;  // per config output: the package output it is
  int64_t pad_batch_to = 1;  // the package's smallest batch: smaller batches are padded to it
};

// Binds and checks the config against the package (`in` and `out`: its call spec). Inputs bind by
// name when every config input names a package input (sluice.inputs, or the keyword arguments of
// the call) or every one has its Triton call name (TritonCallNames: ARGS[0], KWARGS[mask]), else
// by `__<index>` suffix (INPUT__0: the flat position, as Triton's ordinal names), else in config
// order. Outputs: by the dict keys of a package that returns a dict, or by Triton call names
// (RESULT[logits]), else by suffix, else in config order. With the
// recipe's metadata every bound input's dtype, rank and fixed dimensions must match the config,
// a config dimension the package fixes must not be variable, max_batch_size must not exceed the
// exported maximum, and a model without a batch dimension must not be exported with one.
// INVALID_ARGUMENT naming the first mismatch; `warnings` gets what serves but deserves a word
// (no metadata, a batch fixed to 1, a smallest batch above 1).
StatusOr<AotiBinding> BindAotiPackage(const AotiPackageInfo& package, const CallSpecSide& in,
                                      const CallSpecSide& out, const ModelSpec& spec,
                                      std::vector<std::string>* warnings);

// The package file for an instance on `device`: next to `file` (model.pt2), model.cuda.pt2 or
// model.cpu.pt2 when it exists, else `file` itself.
std::string PackageFileFor(const std::string& file, const Device& device);

// Where LibTorch's package loader unpacks a package's shared libraries before it dlopens them:
// the temporary directory of std::filesystem::temp_directory_path ($TMPDIR, ..., else /tmp).
std::string AotiUnpackDirectory();

// What the file system under the unpack directory allows, from statvfs.
struct UnpackDirectoryState {
  bool exists = true;
  bool read_only = false;
  bool noexec =
      false;  // dlopen of a library there fails: "failed to map segment from shared object"
};
UnpackDirectoryState StatUnpackDirectory(const std::string& directory);

// OK when a package can be unpacked and its libraries loaded from `directory`; otherwise
// FAILED_PRECONDITION that says what to change. Containers meet both failures: a read-only root
// file system without a writable /tmp, and Docker's `--tmpfs /tmp`, which mounts it noexec.
Status CheckUnpackDirectory(const std::string& directory, const UnpackDirectoryState& state);

}  // namespace sluice
