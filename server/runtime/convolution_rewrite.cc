#include "server/runtime/convolution_rewrite.h"

#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/ir/ir.h>

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace sluice {
namespace {

using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Value;

void CollectNodes(torch::jit::Block* block, std::vector<Node*>* nodes) {
  for (Node* node : block->nodes()) {
    nodes->push_back(node);
    for (torch::jit::Block* nested : node->blocks()) CollectNodes(nested, nodes);
  }
}

// Convolution operators of ATen: what a traced or scripted model can call.
bool IsConvolution(const std::string& kind) {
  static const std::set<std::string> kKinds = {"aten::_convolution",
                                               "aten::convolution",
                                               "aten::conv1d",
                                               "aten::conv2d",
                                               "aten::conv3d",
                                               "aten::conv_transpose1d",
                                               "aten::conv_transpose2d",
                                               "aten::conv_transpose3d",
                                               "aten::_convolution_mode",
                                               "aten::cudnn_convolution",
                                               "aten::cudnn_convolution_transpose",
                                               "aten::conv_tbc"};
  return kKinds.count(kind) > 0;
}

bool IsIntList(const Value* value) { return value->type()->kind() == c10::TypeKind::ListType; }

// The arguments of aten::_convolution that come from the node being replaced, in order:
// input, weight, bias, stride, padding, dilation, transposed, output_padding, groups.
// Empty when this overload cannot be expressed that way (string padding, other operators).
// `*spatial_rank`: for conv{N}d and conv_transpose{N}d, N (they also accept an unbatched input,
// which aten::_convolution does not); 0 for the others.
std::vector<Value*> ConvolutionArguments(Node* node, Graph* graph, int* spatial_rank) {
  *spatial_rank = 0;
  const std::string kind = node->kind().toQualString();
  auto in = [&](size_t i) { return node->input(i); };
  if (kind == "aten::_convolution" &&
      (node->inputs().size() == 13 || node->inputs().size() == 12)) {
    return {in(0), in(1), in(2), in(3), in(4), in(5), in(6), in(7), in(8)};
  }
  if (kind == "aten::convolution" && node->inputs().size() == 9) {
    return {in(0), in(1), in(2), in(3), in(4), in(5), in(6), in(7), in(8)};
  }
  for (int rank : {1, 2, 3}) {
    if (kind == absl::StrCat("aten::conv", rank, "d") && node->inputs().size() == 7 &&
        IsIntList(in(4))) {
      // conv{N}d(input, weight, bias, stride, padding, dilation, groups)
      *spatial_rank = rank;
      Value* output_padding = graph->insertConstant(c10::IValue(std::vector<int64_t>(rank, 0)));
      return {in(0),          in(1), in(2), in(3), in(4), in(5), graph->insertConstant(false),
              output_padding, in(6)};
    }
    if (kind == absl::StrCat("aten::conv_transpose", rank, "d") && node->inputs().size() == 8) {
      // conv_transpose{N}d(input, weight, bias, stride, padding, output_padding, groups, dilation)
      *spatial_rank = rank;
      return {in(0), in(1), in(2), in(3), in(4), in(7), graph->insertConstant(true), in(5), in(6)};
    }
  }
  return {};
}

}  // namespace

ConvolutionTuning RewriteConvolutions(const torch::jit::Module& module,
                                      const ConvolutionFlags& flags) {
  ConvolutionTuning tuning;
  std::set<std::string> unsupported;
  for (torch::jit::Function* function : module._ivalue()->compilation_unit()->get_functions()) {
    torch::jit::GraphFunction* graph_function = torch::jit::tryToGraphFunction(*function);
    if (graph_function == nullptr) continue;
    std::shared_ptr<Graph> graph = graph_function->graph();
    std::vector<Node*> nodes;
    CollectNodes(graph->block(), &nodes);
    for (Node* node : nodes) {
      const std::string kind = node->kind().toQualString();
      if (!IsConvolution(kind)) continue;
      ++tuning.convolutions;
      torch::jit::WithInsertPoint insert_before(node);
      int spatial_rank = 0;
      std::vector<Value*> arguments = ConvolutionArguments(node, graph.get(), &spatial_rank);
      if (arguments.empty()) {
        const bool string_padding = node->inputs().size() > 4 &&
                                    node->input(4)->type()->kind() == c10::TypeKind::StringType;
        unsupported.insert(string_padding ? kind + " with string padding" : kind);
        continue;
      }
      for (bool flag :
           {flags.benchmark, flags.deterministic, flags.cudnn_enabled, flags.allow_tf32}) {
        arguments.push_back(graph->insertConstant(flag));  // fresh: never shared with another use
      }
      Node* convolution =
          graph->create(c10::Symbol::fromQualString("aten::_convolution"), arguments, 1);
      convolution->output()->setType(node->output()->type());
      convolution->copyMetadata(node);
      if (spatial_rank == 0) {
        convolution->insertBefore(node);
        node->output()->replaceAllUsesWith(convolution->output());
        node->destroy();
      } else {
        // conv{N}d also takes an unbatched input (rank N+1); keep the original call for that
        // case: if input.dim() == N + 2 { _convolution(...) } else { conv{N}d(...) }.
        Value* dim = graph->insert(c10::Symbol::fromQualString("aten::dim"), {node->input(0)});
        Value* batched = graph->insert(c10::Symbol::fromQualString("aten::eq"),
                                       {dim, graph->insertConstant(int64_t{spatial_rank + 2})});
        Node* branch = graph->create(c10::Symbol::fromQualString("prim::If"), {batched}, 1);
        branch->output()->setType(node->output()->type());
        torch::jit::Block* with_batch = branch->addBlock();
        torch::jit::Block* without_batch = branch->addBlock();
        with_batch->appendNode(convolution);
        with_batch->registerOutput(convolution->output());
        Node* original = graph->createClone(node, [](Value* value) { return value; });
        without_batch->appendNode(original);
        without_batch->registerOutput(original->output());
        branch->insertBefore(node);
        node->output()->replaceAllUsesWith(branch->output());
        node->destroy();
      }
      ++tuning.rewritten;
    }
  }
  if (!unsupported.empty()) {
    tuning.fallback =
        absl::StrCat(tuning.convolutions - tuning.rewritten, " convolution call(s) (",
                     absl::StrJoin(unsupported, ", "),
                     ") take no cuDNN flags in the graph; they follow LibTorch's global "
                     "benchmark flag");
  }
  return tuning;
}

}  // namespace sluice
