// sluice-bench-load: a C++ load client for one unary gRPC method with fixed request bytes (a
// serialized message from --request-file), so that a server and the echo floor
// (sluice-bench-echo) are measured by the same client with the same bytes. One thread drives the
// calls on a completion queue: closed loop with --concurrency calls in flight, or open loop at
// --rate calls per second (at most --concurrency in flight; with --poisson the gaps between calls
// are exponential, as independent clients arrive). Warm-up calls are not measured.
// Prints one JSON object: calls, errors, seconds, calls_per_s, latency percentiles (us), and
// client_cpu_busy (this process's user+system CPU time / wall time over the measured window;
// a load client near one full core is itself the bottleneck). Also, for the calls started in the
// window (each followed to its end): sent, ok, the answered calls' p50/p99, the failures by kind
// (unavailable, deadline_exceeded, resource_exhausted: a quota's refusal, other), and with
// --within-us the answers within that time (within, goodput_per_s). not_sent: calls the schedule
// wanted while --concurrency were in flight. With --unique-offset, a share of the calls (1 -
// --repeat-share) carry inputs no call sent before (two FP32 values at that byte offset of the
// request, the first 1000 or more, replaced by a counter), and the others the file's bytes
// unchanged: a response cache's hit rate follows
// --repeat-share. "repeated" counts the unchanged calls.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

namespace {

using Clock = std::chrono::steady_clock;

// gRPC takes deadlines on the system clock only.
std::chrono::system_clock::time_point Wall(Clock::time_point t) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(t - Clock::now());
}

double CpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

struct Call {
  grpc::ClientContext context;
  grpc::ByteBuffer response;
  grpc::Status status;
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> reader;
  Clock::time_point started;
};

double Percentile(std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const size_t index =
      std::min(sorted.size() - 1, static_cast<size_t>(p * static_cast<double>(sorted.size())));
  return sorted[index];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Closed- or open-loop load on one unary gRPC method with fixed request bytes"};
  std::string target;
  std::string method = "/inference.GRPCInferenceService/ModelInfer";
  std::string request_file;
  int concurrency = 1;
  double rate = 0;
  double warmup_seconds = 1;
  double seconds = 5;
  double timeout_seconds = 30;
  bool poisson = false;
  unsigned seed = 1;
  double within_us = 0;
  bool errors_ok = false;
  app.add_option("--target", target, "host:port")->required();
  app.add_option("--method", method, "Full method name")->capture_default_str();
  app.add_option("--request-file", request_file, "The serialized request message")->required();
  app.add_option("--concurrency", concurrency,
                 "Calls in flight (closed loop), or the cap with --rate")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--rate", rate, "Calls per second, open loop (0: closed loop)")
      ->capture_default_str();
  app.add_option("--warmup-seconds", warmup_seconds, "Unmeasured time first")
      ->capture_default_str();
  app.add_option("--seconds", seconds, "Measured time")->capture_default_str();
  app.add_option("--timeout-seconds", timeout_seconds, "Deadline per call")->capture_default_str();
  app.add_flag("--poisson", poisson,
               "With --rate: exponential gaps between calls (Poisson arrivals)");
  app.add_option("--seed", seed, "Seed of the --poisson gaps")->capture_default_str();
  app.add_option("--within-us", within_us,
                 "Count the answers within this many microseconds (goodput)");
  app.add_flag("--errors-ok", errors_ok, "Exit 0 although calls failed (refusals are expected)");
  int64_t unique_offset = -1;
  double repeat_share = 1;
  app.add_option(
         "--unique-offset", unique_offset,
         "Byte offset of two FP32 input values in the request that calls with unique inputs "
         "overwrite with a counter (-1: every call sends the file's bytes)")
      ->capture_default_str();
  app.add_option("--repeat-share", repeat_share,
                 "With --unique-offset: the share of calls that send the file's bytes")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  std::vector<std::string> metadata;
  app.add_option("--metadata", metadata,
                 "key=value sent as metadata with every call (repeatable; e.g. a client id)");
  CLI11_PARSE(app, argc, argv);
  std::vector<std::pair<std::string, std::string>> headers;
  for (const std::string& each : metadata) {
    const size_t equals = each.find('=');
    if (equals == std::string::npos || equals == 0) {
      std::fprintf(stderr, "--metadata %s: write key=value\n", each.c_str());
      return 2;
    }
    headers.emplace_back(each.substr(0, equals), each.substr(equals + 1));
  }

  std::ifstream file(request_file, std::ios::binary);
  if (!file) {
    std::fprintf(stderr, "cannot read %s\n", request_file.c_str());
    return 2;
  }
  std::ostringstream contents;
  contents << file.rdbuf();
  const std::string bytes = contents.str();
  grpc::Slice slice(bytes);
  const grpc::ByteBuffer request(&slice, 1);
  if (unique_offset >= 0 && static_cast<size_t>(unique_offset) + 2 * sizeof(float) > bytes.size()) {
    std::fprintf(stderr, "--unique-offset %lld is past the request's %zu bytes\n",
                 static_cast<long long>(unique_offset), bytes.size());
    return 2;
  }
  std::mt19937_64 repeats(seed + 1);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  uint64_t unique_calls = 0;
  int64_t repeated = 0;
  // The request of the next call: the file's, or one with inputs never sent before.
  auto next_request = [&]() -> grpc::ByteBuffer {
    if (unique_offset < 0 || uniform(repeats) < repeat_share) {
      ++repeated;
      return request;
    }
    std::string unique = bytes;
    const float values[2] = {1000.0f + static_cast<float>(unique_calls % 1000000),
                             static_cast<float>(unique_calls / 1000000)};
    std::memcpy(&unique[static_cast<size_t>(unique_offset)], values, sizeof(values));
    ++unique_calls;
    grpc::Slice unique_slice(unique);
    return grpc::ByteBuffer(&unique_slice, 1);
  };

  grpc::ChannelArguments arguments;
  arguments.SetInt(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, -1);
  auto channel = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), arguments);
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10))) {
    std::fprintf(stderr, "cannot connect to %s\n", target.c_str());
    return 2;
  }
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;

  const Clock::time_point begin = Clock::now();
  const Clock::time_point measure_from = begin + std::chrono::duration_cast<Clock::duration>(
                                                     std::chrono::duration<double>(warmup_seconds));
  const Clock::time_point end = measure_from + std::chrono::duration_cast<Clock::duration>(
                                                   std::chrono::duration<double>(seconds));
  const auto interval =
      rate > 0
          ? std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(1.0 / rate))
          : Clock::duration::zero();
  Clock::time_point next_send = begin;
  std::mt19937_64 random(seed);
  std::exponential_distribution<double> gaps(rate > 0 ? rate : 1.0);
  auto next_gap = [&]() -> Clock::duration {
    if (!poisson) return interval;
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(gaps(random)));
  };
  // Calls started in the window, followed to their end.
  int64_t sent = 0, ok_calls = 0, within = 0, unavailable = 0, deadline_exceeded = 0,
          resource_exhausted = 0, other_failures = 0;
  std::vector<double> answered_us;
  int in_flight = 0;
  int64_t measured = 0, errors = 0, not_sent = 0;
  std::string first_error;
  std::vector<double> latencies_us;
  double cpu_at_start = -1, cpu_at_end = -1;
  Clock::time_point measured_start{}, measured_end{};

  auto start_call = [&](Clock::time_point now) {
    auto* call = new Call();
    call->context.set_deadline(Wall(now + std::chrono::duration_cast<Clock::duration>(
                                              std::chrono::duration<double>(timeout_seconds))));
    call->started = now;
    for (const auto& [key, value] : headers) call->context.AddMetadata(key, value);
    if (now >= measure_from && now < end) ++sent;
    call->reader = stub.PrepareUnaryCall(&call->context, method, next_request(), &cq);
    call->reader->StartCall();
    call->reader->Finish(&call->response, &call->status, call);
    ++in_flight;
  };

  bool sending = true;
  while (sending || in_flight > 0) {
    Clock::time_point now = Clock::now();
    if (cpu_at_start < 0 && now >= measure_from) {
      cpu_at_start = CpuSeconds();
      measured_start = now;
    }
    if (sending && now >= end) {
      sending = false;
      cpu_at_end = CpuSeconds();
      measured_end = now;
    }
    if (!sending && in_flight == 0) break;
    if (sending) {
      if (rate > 0) {
        while (now >= next_send) {
          if (in_flight < concurrency) {
            start_call(now);
          } else if (now >= measure_from) {
            ++not_sent;  // the cap is reached: the server does not keep up with the rate
          }
          next_send += next_gap();
        }
      } else {
        while (in_flight < concurrency) start_call(now);
      }
    }
    void* tag = nullptr;
    bool ok = false;
    const Clock::time_point wait_until =
        sending ? (rate > 0 ? std::min(next_send, end) : end) : now + std::chrono::seconds(60);
    const auto result = cq.AsyncNext(&tag, &ok, Wall(wait_until));
    if (result == grpc::CompletionQueue::SHUTDOWN) break;
    if (result == grpc::CompletionQueue::TIMEOUT) continue;
    std::unique_ptr<Call> call(static_cast<Call*>(tag));
    --in_flight;
    const Clock::time_point done = Clock::now();
    const bool in_window = call->started >= measure_from && done <= end;
    if (call->started >= measure_from && call->started < end) {
      if (ok && call->status.ok()) {
        const double took_us =
            std::chrono::duration<double, std::micro>(done - call->started).count();
        ++ok_calls;
        answered_us.push_back(took_us);
        if (within_us > 0 && took_us <= within_us) ++within;
      } else if (call->status.error_code() == grpc::StatusCode::UNAVAILABLE) {
        ++unavailable;
      } else if (call->status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
        ++deadline_exceeded;
      } else if (call->status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
        ++resource_exhausted;
      } else {
        ++other_failures;
      }
    }
    if (!ok || !call->status.ok()) {
      ++errors;
      if (first_error.empty()) first_error = call->status.error_message();
    } else if (in_window) {
      ++measured;
      latencies_us.push_back(
          std::chrono::duration<double, std::micro>(done - call->started).count());
    }
  }
  std::sort(latencies_us.begin(), latencies_us.end());
  std::sort(answered_us.begin(), answered_us.end());
  const double wall = std::chrono::duration<double>(measured_end - measured_start).count();
  double mean = 0;
  for (double each : latencies_us) mean += each;
  if (!latencies_us.empty()) mean /= static_cast<double>(latencies_us.size());
  std::string escaped;
  for (char c : first_error) {
    if (c == '"' || c == '\\') escaped += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) escaped += c;
  }
  std::printf(
      "{\"calls\": %lld, \"errors\": %lld, \"not_sent\": %lld, \"seconds\": %.4f, \"calls_per_s\": "
      "%.1f, "
      "\"p50_us\": %.1f, \"p90_us\": %.1f, \"p99_us\": %.1f, \"mean_us\": %.1f, "
      "\"client_cpu_busy\": %.3f, "
      "\"concurrency\": %d, \"rate\": %.1f, \"poisson\": %s, \"sent\": %lld, \"ok\": %lld, "
      "\"answered_p50_us\": %.1f, \"answered_p99_us\": %.1f, \"unavailable\": %lld, "
      "\"deadline_exceeded\": %lld, \"resource_exhausted\": %lld, "
      "\"other_failures\": %lld, \"within_us\": %.1f, \"within\": %lld, \"goodput_per_s\": %.1f, "
      "\"repeated\": %lld, \"first_error\": \"%s\"}\n",
      static_cast<long long>(measured), static_cast<long long>(errors),
      static_cast<long long>(not_sent), wall, wall > 0 ? static_cast<double>(measured) / wall : 0.0,
      Percentile(latencies_us, 0.5), Percentile(latencies_us, 0.9), Percentile(latencies_us, 0.99),
      mean, wall > 0 ? (cpu_at_end - cpu_at_start) / wall : 0.0, concurrency, rate,
      poisson ? "true" : "false", static_cast<long long>(sent), static_cast<long long>(ok_calls),
      Percentile(answered_us, 0.5), Percentile(answered_us, 0.99),
      static_cast<long long>(unavailable), static_cast<long long>(deadline_exceeded),
      static_cast<long long>(resource_exhausted), static_cast<long long>(other_failures), within_us,
      static_cast<long long>(within), wall > 0 ? static_cast<double>(within) / wall : 0.0,
      static_cast<long long>(repeated), escaped.c_str());
  return errors > 0 && !errors_ok ? 1 : 0;
}
