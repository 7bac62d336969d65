// sluice-bench-echo: the transport's floor. A gRPC server with no model and no parsing: every
// call, whatever its method, is answered with an empty message. Sluice's per-request cost is
// measured against it (benchmarks/floor_benchmark.py): same gRPC, same client, same request bytes.
//
//   --api callback  the callback API through a generic service (what sluice-server uses)
//   --api cq        the completion-queue API (AsyncGenericService), --cq-threads threads each
//                   polling their own queue
// Prints "listening on <port>" once it serves; stops on SIGTERM/SIGINT.
#include <csignal>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>

namespace {

// An empty message (a ByteBuffer with no slice at all is not a message: gRPC refuses to send it).
grpc::ByteBuffer EmptyMessage() {
  grpc::Slice empty;
  return grpc::ByteBuffer(&empty, 1);
}

// Reads the one request of a unary call and answers it with an empty message.
class EchoReactor final : public grpc::ServerGenericBidiReactor {
 public:
  EchoReactor() { StartRead(&request_); }
  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no request message"));
      return;
    }
    StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
  }
  void OnDone() override { delete this; }

 private:
  grpc::ByteBuffer request_;
  grpc::ByteBuffer response_ = EmptyMessage();
};

class CallbackEcho final : public grpc::CallbackGenericService {
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    return new EchoReactor();
  }
};

// One call on the completion-queue API: request, read, write-and-finish, done; each step's tag
// is the call itself.
class CqCall {
 public:
  CqCall(grpc::AsyncGenericService* service, grpc::ServerCompletionQueue* cq)
      : service_(service), cq_(cq) {
    service_->RequestCall(&context_, &stream_, cq_, cq_, this);
  }
  void Proceed(bool ok) {
    switch (state_) {
      case State::kRequested:
        if (!ok) {  // shutting down
          delete this;
          return;
        }
        new CqCall(service_, cq_);  // the next call waits while this one runs
        state_ = State::kReading;
        stream_.Read(&request_, this);
        return;
      case State::kReading:
        state_ = State::kFinishing;
        if (!ok) {
          stream_.Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no request message"),
                         this);
        } else {
          stream_.WriteAndFinish(response_, grpc::WriteOptions(), grpc::Status::OK, this);
        }
        return;
      case State::kFinishing:
        delete this;
        return;
    }
  }

 private:
  enum class State { kRequested, kReading, kFinishing };
  grpc::AsyncGenericService* const service_;
  grpc::ServerCompletionQueue* const cq_;
  grpc::GenericServerContext context_;
  grpc::GenericServerAsyncReaderWriter stream_{&context_};
  grpc::ByteBuffer request_;
  grpc::ByteBuffer response_ = EmptyMessage();
  State state_ = State::kRequested;
};

volatile std::sig_atomic_t g_stop = 0;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "A gRPC server that answers every call with an empty message (the transport's floor)"};
  std::string address = "127.0.0.1";
  int port = 0;
  std::string api = "callback";
  int cq_threads = 1;
  app.add_option("--address", address, "Address to listen on")->capture_default_str();
  app.add_option("--port", port, "Port (0: any free one; the chosen port is printed)")
      ->capture_default_str();
  app.add_option("--api", api, "callback or cq")
      ->check(CLI::IsMember({"callback", "cq"}))
      ->capture_default_str();
  app.add_option("--cq-threads", cq_threads,
                 "Polling threads (one completion queue each) with --api cq")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  grpc::ServerBuilder builder;
  int chosen_port = 0;
  builder.AddListeningPort(address + ":" + std::to_string(port), grpc::InsecureServerCredentials(),
                           &chosen_port);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  CallbackEcho callback;
  grpc::AsyncGenericService async;
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> queues;
  if (api == "callback") {
    builder.RegisterCallbackGenericService(&callback);
  } else {
    builder.RegisterAsyncGenericService(&async);
    for (int i = 0; i < cq_threads; ++i) queues.push_back(builder.AddCompletionQueue());
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || chosen_port == 0) {
    std::fprintf(stderr, "cannot listen on %s:%d\n", address.c_str(), port);
    return 1;
  }
  std::vector<std::thread> pollers;
  for (auto& queue : queues) {
    pollers.emplace_back([&async, cq = queue.get()] {
      new CqCall(&async, cq);
      void* tag = nullptr;
      bool ok = false;
      while (cq->Next(&tag, &ok)) static_cast<CqCall*>(tag)->Proceed(ok);
    });
  }
  std::printf("listening on %d\n", chosen_port);
  std::fflush(stdout);
  std::signal(SIGTERM, [](int) { g_stop = 1; });
  std::signal(SIGINT, [](int) { g_stop = 1; });
  while (!g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  for (auto& queue : queues) queue->Shutdown();
  for (std::thread& poller : pollers) poller.join();
  return 0;
}
