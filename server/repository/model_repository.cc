#include "server/repository/model_repository.h"

#include <ftw.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/core/message_text.h"
#include "server/repository/model_config_parser.h"
#include "spdlog/spdlog.h"

namespace sluice {
namespace fs = std::filesystem;

namespace {

StatusOr<std::string> ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path.string()));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

StatusOr<inference::ModelConfig> ReadConfigFile(const fs::path& directory) {
  const fs::path config_path = directory / "config.pbtxt";
  std::error_code ec;
  if (!fs::is_regular_file(config_path, ec)) {
    return absl::NotFoundError(absl::StrCat("no config.pbtxt in ", directory.string()));
  }
  SLUICE_ASSIGN_OR_RETURN(const std::string text, ReadFile(config_path));
  return ParseModelConfigText(text, config_path.string());
}

// The override's config, completed from config.pbtxt where Triton would complete it from the
// model file (see ReadModelDirectory).
StatusOr<inference::ModelConfig> OverrideConfig(const fs::path& directory,
                                                const std::string& json) {
  SLUICE_ASSIGN_OR_RETURN(inference::ModelConfig config, ParseModelConfigJson(json));
  const bool needs_tensors = config.input_size() == 0 && config.output_size() == 0;
  const bool needs_runtime = config.platform().empty() && config.backend().empty();
  if (!needs_tensors && !needs_runtime) return config;
  StatusOr<inference::ModelConfig> repository = ReadConfigFile(directory);
  if (!repository.ok()) return config;  // nothing to complete from: the override stands alone
  if (needs_tensors) {
    *config.mutable_input() = repository->input();
    *config.mutable_output() = repository->output();
  }
  if (needs_runtime) {
    config.set_platform(repository->platform());
    config.set_backend(repository->backend());
  }
  return config;
}

// An operator library runs in the server with its privileges: it comes from the operator (the
// repository on disk, an --operator-library-dir), never from a client. A configuration override
// may name one relative to the model's directory or those directories, not by absolute path, and
// files sent with a load may not bring one at all.
Status CheckOverrideLibraries(const ModelSpec& spec, const ModelOverride& override) {
  std::vector<std::string> named = spec.operator_libraries;
  if (!spec.init_library.empty()) named.push_back(spec.init_library);
  if (named.empty() || override.empty()) return absl::OkStatus();
  if (!override.files.empty()) {
    return absl::InvalidArgumentError(
        "a model loaded with files sent in the request cannot name operator libraries "
        "(sluice.operator_libraries, "
        "MODEL_INIT_LIBRARY): they would run the client's code in the server; put the model in the "
        "repository");
  }
  for (const std::string& path : named) {
    if (!path.empty() && path.front() == '/') {
      return absl::InvalidArgumentError(absl::StrCat(
          "a configuration override cannot name an operator library by absolute path ('",
          QuoteClientText(path),
          "'); name it relative to the model's directory or an --operator-library-dir"));
    }
  }
  return absl::OkStatus();
}

// Reads each output's label_filename (relative to the model's directory; the parser refused any
// other path) into its labels: one label per line, a trailing '\r' dropped.
Status ReadLabels(const fs::path& directory, ModelSpec* spec) {
  for (TensorSpec& output : spec->outputs) {
    if (output.label_filename.empty()) continue;
    const fs::path path = directory / output.label_filename;
    std::ifstream file(path);
    if (!file) {
      return absl::NotFoundError(absl::StrCat("output '", output.name,
                                              "': cannot read its label_filename ", path.string(),
                                              ": ", std::strerror(errno)));
    }
    auto labels = std::make_shared<std::vector<std::string>>();
    for (std::string line; std::getline(file, line);) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      labels->push_back(std::move(line));
    }
    if (file.bad()) {
      return absl::DataLossError(
          absl::StrCat("output '", output.name, "': reading ", path.string(), " failed"));
    }
    output.labels = std::move(labels);
  }
  return absl::OkStatus();
}

// Reads each sequence state's initial_state data_file (in the model's initial_state/ directory;
// the parser refused any other path): exactly the state's bytes, row-major.
Status ReadInitialStates(const fs::path& directory, ModelSpec* spec) {
  for (SequenceStateSpec& state : spec->sequence_batching.states) {
    if (state.initial_file.empty()) continue;
    const fs::path path = directory / "initial_state" / state.initial_file;
    std::ifstream file(path, std::ios::binary);
    if (!file) {
      return absl::NotFoundError(absl::StrCat("sequence_batching state '", state.input,
                                              "': cannot read its initial_state data_file ",
                                              path.string(), ": ", std::strerror(errno)));
    }
    std::ostringstream bytes;
    bytes << file.rdbuf();
    size_t expected = ElementSize(state.dtype);
    for (int64_t dim : state.dims) expected *= static_cast<size_t>(dim);
    std::string data = std::move(bytes).str();
    if (data.size() != expected) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence_batching state '", state.input, "': initial_state data_file ", path.string(),
          " holds ", data.size(), " bytes; ", DataTypeName(state.dtype), " [",
          absl::StrJoin(state.dims, ","), "] is ", expected, " (raw, row-major, no header)"));
    }
    state.initial = std::make_shared<const std::string>(std::move(data));
  }
  return absl::OkStatus();
}

// The newest version directory of `directory` (empty: none).
fs::path NewestVersion(const fs::path& directory) {
  fs::path newest;
  int64_t highest = 0;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(directory, ec)) {
    int64_t version = 0;
    if (entry.is_directory() && absl::SimpleAtoi(entry.path().filename().string(), &version) &&
        version > highest) {
      highest = version;
      newest = entry.path();
    }
  }
  return newest;
}

// Triton's auto-complete for what a model file can tell: a configuration that names no inputs and
// outputs (or no config.pbtxt at all) gets them, with the platform, max_batch_size and
// dynamic_batching {}, from the newest version's model file. A TorchScript file cannot tell its
// tensors: refused, saying what to write. Left as it is when there is no version or no model file
// (the rest of FillModel names that).
Status CompleteFromModelFile(const fs::path& directory, const ModelDescriber& describer,
                             inference::ModelConfig* config) {
  if (config->input_size() > 0 || config->output_size() > 0) return absl::OkStatus();
  const fs::path version = NewestVersion(directory);
  if (version.empty()) return absl::OkStatus();
  std::error_code ec;
  std::string file = config->default_model_filename();
  if (file.empty()) {
    const bool aoti = config->platform() == kTorchAotiPlatform ||
                      (config->platform().empty() && config->backend().empty() &&
                       fs::is_regular_file(version / "model.pt2", ec));
    file = aoti ? "model.pt2" : "model.pt";
  }
  const fs::path path = version / file;
  if (!fs::is_regular_file(path, ec)) return absl::OkStatus();
  if (config->platform() != kTorchAotiPlatform && fs::path(file).extension() != ".pt2") {
    return absl::InvalidArgumentError(absl::StrCat(
        "the configuration names no inputs and outputs, and a TorchScript file (", file,
        ") cannot tell their datatypes and shapes: declare them in config.pbtxt (input [ { name: "
        "\"INPUT__0\" data_type: TYPE_FP32 dims: [ ... ] } ] and output [ ... ]), or let "
        "models/sluice_export.py write config.pbtxt from example inputs"));
  }
  SLUICE_ASSIGN_OR_RETURN(const ModelDescription description, describer.Describe(path));
  if (config->platform().empty() && config->backend().empty())
    config->set_platform(description.platform);
  if (description.batched && config->max_batch_size() == 0) {
    config->set_max_batch_size(static_cast<int32_t>(
        description.batch_max > 0 ? description.batch_max : kDefaultMaxBatchSize));
  }
  if (config->max_batch_size() > 0 && !config->has_dynamic_batching() &&
      !config->has_sequence_batching()) {
    config->mutable_dynamic_batching();
  }
  auto fill = [](const DescribedTensor& tensor, auto* out) {
    out->set_name(tensor.name);
    const std::string type = tensor.dtype == DataType::kBytes
                                 ? std::string("TYPE_STRING")
                                 : absl::StrCat("TYPE_", DataTypeName(tensor.dtype));
    inference::DataType data_type = inference::TYPE_INVALID;
    inference::DataType_Parse(type, &data_type);
    out->set_data_type(data_type);
    for (int64_t dim : tensor.dims) out->add_dims(dim);
  };
  for (const DescribedTensor& input : description.inputs) fill(input, config->add_input());
  for (const DescribedTensor& output : description.outputs) fill(output, config->add_output());
  spdlog::info("event=config_completed model={} file={} inputs={} outputs={} max_batch_size={}",
               directory.filename().string(), path.string(), description.inputs.size(),
               description.outputs.size(), config->max_batch_size());
  return absl::OkStatus();
}

Status FillModel(RepositoryModel* model, const ModelOverride& override,
                 const ModelDescriber* describer) {
  StatusOr<inference::ModelConfig> read =
      override.config_json ? OverrideConfig(model->directory, *override.config_json)
                           : ReadConfigFile(model->directory);
  // Without config.pbtxt a model file that tells its tensors is configured from them alone.
  if (!read.ok() && absl::IsNotFound(read.status()) && describer != nullptr)
    read = inference::ModelConfig();
  SLUICE_RETURN_IF_ERROR(read.status());
  inference::ModelConfig config = *std::move(read);
  if (describer != nullptr) {
    SLUICE_RETURN_IF_ERROR(CompleteFromModelFile(model->directory, *describer, &config));
  }
  const StatusOr<ModelSpec> spec = BuildModelSpec(model->name, &config);
  // Kept even when the spec is refused: the ModelConfig RPC shows what was read.
  model->config = std::make_shared<const inference::ModelConfig>(std::move(config));
  SLUICE_RETURN_IF_ERROR(spec.status());
  model->spec = *spec;
  SLUICE_RETURN_IF_ERROR(CheckOverrideLibraries(model->spec, override));
  SLUICE_RETURN_IF_ERROR(ReadLabels(model->directory, &model->spec));
  SLUICE_RETURN_IF_ERROR(ReadInitialStates(model->directory, &model->spec));

  std::map<int64_t, fs::path> on_disk;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(model->directory, ec)) {
    int64_t version = 0;
    if (!entry.is_directory() || !absl::SimpleAtoi(entry.path().filename().string(), &version) ||
        version < 1) {
      continue;
    }
    on_disk[version] = entry.path();
  }
  if (ec)
    return absl::NotFoundError(
        absl::StrCat("cannot list ", model->directory.string(), ": ", ec.message()));
  if (on_disk.empty()) {
    return absl::NotFoundError(
        absl::StrCat("no version directory (1/, 2/, ...) in ", model->directory.string()));
  }
  std::vector<int64_t> available;
  for (const auto& [version, path] : on_disk) available.push_back(version);
  const std::vector<int64_t> chosen = SelectVersions(model->config->version_policy(), available);
  if (model->config->version_policy().has_specific()) {
    std::vector<int64_t> missing;
    for (int64_t wanted : model->config->version_policy().specific().versions()) {
      if (!on_disk.count(wanted)) missing.push_back(wanted);
    }
    if (!missing.empty()) {
      return absl::NotFoundError(absl::StrCat("version_policy asks for version(s) ",
                                              absl::StrJoin(missing, ", "),
                                              " which have no directory"));
    }
  }
  if (chosen.empty()) return absl::NotFoundError("version_policy selects no version");
  for (int64_t version : chosen) {
    model->versions[version] = on_disk[version] / model->spec.model_filename;
  }
  return absl::OkStatus();
}

// Deletes `path` and everything below it, not following symbolic links; a path that is not there
// is not an error. Not std::filesystem::remove_all: the LibTorch wheel's libtorch.so exports its
// own copy of that symbol, which the dynamic linker binds for the whole process, and it jumps
// through a null pointer (seen with torch 2.11, where the tree is not empty).
void RemoveTree(const fs::path& path) {
  auto remove_one = [](const char* each, const struct stat*, int, struct FTW*) {
    ::remove(each);  // best effort: what cannot be removed stays, the walk goes on
    return 0;
  };
  nftw(path.c_str(), remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

// Relative path, size and modification time of every regular file under `directory`, sorted.
std::string Fingerprint(const fs::path& directory) {
  std::vector<std::string> files;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(directory, ec), end; !ec && it != end;
       it.increment(ec)) {
    std::error_code file_ec;
    if (!it->is_regular_file(file_ec)) continue;
    const uintmax_t size = it->file_size(file_ec);
    const auto mtime = it->last_write_time(file_ec).time_since_epoch().count();
    files.push_back(
        absl::StrCat(fs::relative(it->path(), directory, file_ec).string(), ":", size, ":", mtime));
  }
  std::sort(files.begin(), files.end());
  return absl::StrJoin(files, "\n");
}

}  // namespace

RepositoryModel ReadModelDirectory(const fs::path& directory, const ModelOverride& override,
                                   const std::string& name, const ModelDescriber* describer) {
  RepositoryModel model;
  model.name = name.empty() ? directory.filename().string() : name;
  model.directory = directory;
  model.fingerprint = Fingerprint(directory);
  if (override.config_json)
    absl::StrAppend(&model.fingerprint, "\nconfig override:", *override.config_json);
  model.status = FillModel(&model, override, describer);
  if (!model.status.ok()) model.spec = ModelSpec{};
  return model;
}

StatusOr<std::vector<RepositoryModel>> ScanModelRepository(const fs::path& root,
                                                           const ModelDescriber* describer) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) {
    return absl::NotFoundError(absl::StrCat("model repository '", root.string(),
                                            "' is not a directory (check --model-repository)"));
  }
  std::vector<fs::path> directories;
  for (const fs::directory_entry& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    // Hidden directories, and the bytecode cache Python leaves beside a script in the repository
    // (the bundled one holds its generator): neither is a model, and a model that fails to load
    // would keep the server from being ready.
    if (entry.is_directory() && !name.empty() && name.front() != '.' && name != "__pycache__") {
      directories.push_back(entry.path());
    }
  }
  if (ec) {
    return absl::NotFoundError(
        absl::StrCat("cannot list model repository '", root.string(), "': ", ec.message()));
  }
  std::sort(directories.begin(), directories.end());
  std::vector<RepositoryModel> models;
  for (const fs::path& directory : directories)
    models.push_back(ReadModelDirectory(directory, {}, "", describer));
  return models;
}

StatusOr<RepositoryModel> DirectoryModelSource::Read(const std::string& name,
                                                     const ModelOverride& override) const {
  if (name.empty() || name.front() == '.' || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", QuoteClientText(name),
                     "' is not a model name (a directory directly under the model repository, "
                     "not starting with '.')"));
  }
  if (!override.files.empty()) {
    if (files_ == nullptr) {
      return absl::FailedPreconditionError(
          "model files sent with a load are not accepted (--allow-load-files)");
    }
    SLUICE_ASSIGN_OR_RETURN(const fs::path directory, files_->Write(name, override.files));
    RepositoryModel model = ReadModelDirectory(directory, override, name, describer_);
    if (!model.status.ok()) files_->Discard(directory);  // it will not be served
    return model;
  }
  const fs::path directory = root_ / name;
  std::error_code ec;
  if (!fs::is_directory(directory, ec)) {
    // The directory is the operator's root and the client's name: room for a long root.
    return absl::NotFoundError(absl::StrCat("the model repository has no model '",
                                            QuoteClientText(name), "' (no directory ",
                                            QuoteClientText(directory.string(), 1024), ")"));
  }
  return ReadModelDirectory(directory, override, "", describer_);
}

void DirectoryModelSource::Retain(const std::string& name, const fs::path& serving) const {
  if (files_ != nullptr) files_->Retain(name, serving);
}

StatusOr<std::unique_ptr<LoadedFileStore>> LoadedFileStore::Create(Options options) {
  RemoveTree(options.root);  // what an earlier run left (a crash): never served again
  std::error_code ec;
  fs::create_directories(options.root, ec);
  if (ec || !fs::is_directory(options.root)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot create the directory for model files sent with loads '",
                     options.root.string(), "'", ec ? ": " + ec.message() : ""));
  }
  fs::permissions(options.root, fs::perms::owner_all, fs::perm_options::replace, ec);  // private
  return std::unique_ptr<LoadedFileStore>(new LoadedFileStore(std::move(options)));
}

LoadedFileStore::~LoadedFileStore() { RemoveTree(options_.root); }

StatusOr<fs::path> LoadedFileStore::Write(const std::string& name,
                                          const std::map<std::string, std::string>& files) {
  uint64_t bytes = 0;
  for (const auto& [path, contents] : files) bytes += contents.size();
  fs::path directory;
  {
    MutexLock lock(&mutex_);
    if (bytes > options_.disk_bytes || bytes_in_use_ > options_.disk_bytes - bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the model files sent with this load (", bytes,
                       " bytes) do not fit beside those of the loads serving now (", bytes_in_use_,
                       " bytes) within --load-files-disk-bytes ", options_.disk_bytes));
    }
    directory = options_.root / absl::StrCat(name, ".", next_++);
    written_[directory] = Written{name, bytes};
    bytes_in_use_ += bytes;
  }
  auto fail = [&](const std::string& why) {
    Discard(directory);
    return absl::InternalError(
        absl::StrCat("cannot write the model files sent with the load of '", name, "': ", why));
  };
  std::error_code ec;
  for (const auto& [relative, contents] : files) {
    const fs::path target = directory / relative;  // the front end checked every component
    fs::create_directories(target.parent_path(), ec);
    if (ec) return fail(ec.message());
    std::ofstream out(target, std::ios::binary | std::ios::trunc);
    out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
    out.close();
    if (!out) return fail(absl::StrCat("writing ", relative, " failed"));
  }
  return directory;
}

void LoadedFileStore::Retain(const std::string& name, const fs::path& serving) {
  Remove([&](const fs::path& directory, const Written& written) {
    return written.name == name && directory != serving;
  });
}

void LoadedFileStore::Discard(const fs::path& directory) {
  Remove([&](const fs::path& each, const Written&) { return each == directory; });
}

void LoadedFileStore::Remove(absl::FunctionRef<bool(const fs::path&, const Written&)> which) {
  std::vector<fs::path> removed;
  {
    MutexLock lock(&mutex_);
    for (auto it = written_.begin(); it != written_.end();) {
      if (which(it->first, it->second)) {
        bytes_in_use_ -= it->second.bytes;
        removed.push_back(it->first);
        it = written_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const fs::path& directory : removed) RemoveTree(directory);
}

uint64_t LoadedFileStore::bytes_in_use() const {
  MutexLock lock(&mutex_);
  return bytes_in_use_;
}

}  // namespace sluice
