// sluice-client: talk to a Sluice (or any KServe v2 / Triton gRPC) server from the shell.
#include <cstdlib>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/strings/str_join.h"
#include "client/client.h"
#include "client/tensor_io.h"
#include "server/core/bytes_tensor.h"

namespace {

int Fail(const sluice::Status& status) {
  std::cerr << "error: " << absl::StatusCodeToString(status.code()) << ": " << status.message()
            << "\n";
  return EXIT_FAILURE;
}

struct InferFlags {
  std::string model;
  std::string version;
  std::vector<std::string> inputs;  // NAME=path.npy
  std::vector<std::string> texts;   // NAME=STRING, one element each (BYTES inputs)
  std::vector<std::string> outputs;
  int64_t batch_size = 1;
  uint64_t seed = 0;
  size_t max_values = 8;
  std::string id;
  std::string sequence_id;
  bool sequence_start = false;
  bool sequence_end = false;
};

std::string ShapeText(const google::protobuf::RepeatedField<int64_t>& shape) {
  return "[" + absl::StrJoin(shape, ",") + "]";
}

int RunInfer(sluice::Client& client, const InferFlags& flags) {
  auto metadata = client.ModelMetadata(flags.model, flags.version);
  if (!metadata.ok()) return Fail(metadata.status());
  std::map<std::string, std::string> files;
  for (const std::string& spec : flags.inputs) {
    const size_t eq = spec.find('=');
    if (eq == std::string::npos) {
      return Fail(absl::InvalidArgumentError("--input takes NAME=FILE.npy, got '" + spec + "'"));
    }
    files[spec.substr(0, eq)] = spec.substr(eq + 1);
  }
  std::map<std::string, std::vector<std::string>> texts;
  for (const std::string& spec : flags.texts) {
    const size_t eq = spec.find('=');
    if (eq == std::string::npos) {
      return Fail(absl::InvalidArgumentError("--text takes NAME=STRING, got '" + spec + "'"));
    }
    texts[spec.substr(0, eq)].push_back(spec.substr(eq + 1));
  }
  std::mt19937_64 rng(flags.seed);
  std::vector<sluice::Tensor> inputs;
  for (const auto& meta : metadata->inputs()) {
    if (auto text = texts.find(meta.name()); text != texts.end()) {
      if (meta.datatype() != "BYTES") {
        return Fail(absl::InvalidArgumentError("--text: input '" + meta.name() + "' is " +
                                               meta.datatype() + ", not BYTES"));
      }
      // The strings fill the first variable dimension (the batch, when the model batches); the
      // other variable dimensions are 1.
      const int64_t count = static_cast<int64_t>(text->second.size());
      int64_t fixed = 1;
      for (int64_t dim : meta.shape()) fixed *= dim >= 0 ? dim : 1;
      sluice::Shape shape;
      bool filled = false;
      for (int64_t dim : meta.shape()) {
        shape.push_back(dim >= 0 ? dim : (filled ? 1 : count / fixed));
        filled = filled || dim < 0;
      }
      if ((filled && count % fixed != 0) || (!filled && count != fixed)) {
        return Fail(absl::InvalidArgumentError("--text: " + std::to_string(count) +
                                               " strings do not fit input '" + meta.name() +
                                               "' of shape " + ShapeText(meta.shape())));
      }
      sluice::Tensor tensor{meta.name(), sluice::DataType::kBytes, shape, ""};
      for (const std::string& element : text->second)
        sluice::AppendBytesElement(element, &tensor.data);
      inputs.push_back(std::move(tensor));
      texts.erase(text);
      continue;
    }
    auto file = files.find(meta.name());
    if (file != files.end()) {
      auto tensor = sluice::ReadNpyFile(file->second, meta.name());
      if (!tensor.ok()) return Fail(tensor.status());
      inputs.push_back(*std::move(tensor));
      files.erase(file);
      continue;
    }
    const std::optional<sluice::DataType> dtype = sluice::ParseDataTypeName(meta.datatype());
    if (!dtype) return Fail(absl::InvalidArgumentError("unsupported datatype " + meta.datatype()));
    sluice::Shape shape;
    for (int i = 0; i < meta.shape_size(); ++i) {
      // A leading -1 is the batch dimension; other variable dimensions get size 1.
      const int64_t dim = meta.shape(i);
      shape.push_back(dim >= 0 ? dim : (i == 0 ? flags.batch_size : 1));
    }
    auto tensor = sluice::RandomTensor(meta.name(), *dtype, shape, rng);
    if (!tensor.ok()) return Fail(tensor.status());
    inputs.push_back(*std::move(tensor));
  }
  if (!files.empty() || !texts.empty()) {
    return Fail(absl::InvalidArgumentError(
        "model '" + flags.model + "' has no input '" +
        (files.empty() ? texts.begin()->first : files.begin()->first) + "'"));
  }
  for (const auto& input : inputs) {
    std::cout << "input  " << input.name << " " << sluice::DataTypeName(input.dtype) << " "
              << sluice::ShapeToString(input.shape) << " "
              << sluice::PreviewValues(input, flags.max_values) << "\n";
  }
  sluice::Client::InferOptions options;
  options.outputs = flags.outputs;
  options.version = flags.version;
  options.id = flags.id;
  options.sequence_id = flags.sequence_id;
  options.sequence_start = flags.sequence_start;
  options.sequence_end = flags.sequence_end;
  auto outputs = client.Infer(flags.model, inputs, options);
  if (!outputs.ok()) return Fail(outputs.status());
  for (const auto& output : *outputs) {
    std::cout << "output " << output.name << " " << sluice::DataTypeName(output.dtype) << " "
              << sluice::ShapeToString(output.shape) << " "
              << sluice::PreviewValues(output, flags.max_values) << "\n";
  }
  return EXIT_SUCCESS;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"sluice-client: query a KServe v2 / Triton gRPC inference server"};
  app.require_subcommand(1);
  std::string url = "localhost:8001";
  int timeout_ms = 30000;
  app.add_option("--url", url, "Server address host:port")->capture_default_str();
  app.add_option("--timeout-ms", timeout_ms, "Deadline of each call")->capture_default_str();
  sluice::ClientTlsOptions tls;
  app.add_flag("--ssl", tls.enabled, "Connect with TLS");
  app.add_option("--root-cert", tls.root_cert,
                 "PEM CA the server's certificate must be signed by (default: the system's)");
  app.add_option("--client-cert", tls.client_cert,
                 "PEM certificate of this client, for mutual TLS");
  app.add_option("--client-key", tls.client_key, "PEM private key of this client, for mutual TLS");
  app.add_option("--ssl-target-name", tls.target_name,
                 "Name the server's certificate must carry when it is not the URL's host (e.g. a "
                 "probe connecting to 127.0.0.1)");

  auto* health = app.add_subcommand(
      "health", "Print whether the server is live and ready (exit 1 if not ready)");
  bool live_only = false;
  health->add_flag("--live", live_only,
                   "Exit 0 when the server is live, ready or not (a liveness probe)");
  auto* models = app.add_subcommand("models", "List the repository's models, versions and states");
  std::string model, version;
  auto* metadata = app.add_subcommand("metadata", "Print a model's inputs and outputs");
  metadata->add_option("model", model, "Model name")->required();
  metadata->add_option("--model-version", version, "Version (default: newest ready)");
  auto* config = app.add_subcommand("config", "Print a model's configuration (protobuf text)");
  config->add_option("model", model, "Model name")->required();
  config->add_option("--model-version", version, "Version (default: newest ready)");

  InferFlags infer_flags;
  auto* infer = app.add_subcommand("infer", "Run one inference with random inputs or .npy files");
  infer->add_option("model", infer_flags.model, "Model name")->required();
  infer->add_option("--model-version", infer_flags.version, "Version (default: newest ready)");
  infer->add_option("--input", infer_flags.inputs,
                    "NAME=FILE.npy; inputs not given get random data");
  infer->add_option(
      "--text", infer_flags.texts,
      "NAME=STRING: one element of a BYTES input; repeat for more (they fill the batch)");
  infer->add_option("--output", infer_flags.outputs, "Output to request (default: all)");
  infer->add_option("-b,--batch-size", infer_flags.batch_size, "Batch size of random inputs")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  infer->add_option("--seed", infer_flags.seed, "Seed of the random inputs")->capture_default_str();
  infer->add_option("--max-values", infer_flags.max_values, "Values printed per tensor")
      ->capture_default_str();
  infer->add_option("--id", infer_flags.id, "Request id, echoed by the server");
  infer->add_option(
      "--sequence-id", infer_flags.sequence_id,
      "Stateful models: the request's sequence (correlation) id, a number or a string");
  infer->add_flag("--sequence-start", infer_flags.sequence_start,
                  "This request starts the sequence");
  infer->add_flag("--sequence-end", infer_flags.sequence_end, "This request ends the sequence");

  CLI11_PARSE(app, argc, argv);

  sluice::ClientOptions options;
  options.timeout = std::chrono::milliseconds(timeout_ms);
  options.tls = tls;
  auto connected = sluice::Client::Connect(url, options);
  if (!connected.ok()) return Fail(connected.status());
  std::unique_ptr<sluice::Client> client = *std::move(connected);

  if (*health) {
    auto live = client->ServerLive();
    if (!live.ok()) return Fail(live.status());
    auto ready = client->ServerReady();
    if (!ready.ok()) return Fail(ready.status());
    std::cout << "live: " << (*live ? "true" : "false")
              << "\nready: " << (*ready ? "true" : "false") << "\n";
    return (live_only ? *live : *ready) ? EXIT_SUCCESS : EXIT_FAILURE;
  }
  if (*models) {
    auto index = client->RepositoryIndex();
    if (!index.ok()) return Fail(index.status());
    for (const auto& entry : index->models()) {
      std::cout << entry.name() << "\t" << (entry.version().empty() ? "-" : entry.version()) << "\t"
                << entry.state() << (entry.reason().empty() ? "" : "\t" + entry.reason()) << "\n";
    }
    return EXIT_SUCCESS;
  }
  if (*metadata) {
    auto meta = client->ModelMetadata(model, version);
    if (!meta.ok()) return Fail(meta.status());
    std::cout << "model: " << meta->name() << "\nplatform: " << meta->platform()
              << "\nversions: " << absl::StrJoin(meta->versions(), ",") << "\n";
    for (const auto& input : meta->inputs()) {
      std::cout << "input  " << input.name() << " " << input.datatype() << " "
                << ShapeText(input.shape()) << "\n";
    }
    for (const auto& output : meta->outputs()) {
      std::cout << "output " << output.name() << " " << output.datatype() << " "
                << ShapeText(output.shape()) << "\n";
    }
    return EXIT_SUCCESS;
  }
  if (*config) {
    auto model_config = client->ModelConfig(model, version);
    if (!model_config.ok()) return Fail(model_config.status());
    std::cout << model_config->DebugString();
    return EXIT_SUCCESS;
  }
  return RunInfer(*client, infer_flags);
}
