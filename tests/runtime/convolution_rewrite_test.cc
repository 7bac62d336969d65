// The per-model cuDNN flags: every convolution of a loaded module, in every method and
// submodule, is rewritten to aten::_convolution with fresh constant flags, and still computes
// what it computed before.
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/script.h>

#include <filesystem>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/runtime/convolution_rewrite.h"
#include "tests/runtime/test_modules.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;

struct ConvolutionNode {
  std::string function;
  std::vector<c10::IValue> constants;  // each input's constant value (None when not a constant)
};

// Every convolution call left in the module's graphs, with its constant arguments.
std::vector<ConvolutionNode> Convolutions(const torch::jit::Module& module,
                                          std::vector<std::string>* others) {
  std::vector<ConvolutionNode> found;
  std::function<void(torch::jit::Block*, const std::string&)> walk = [&](torch::jit::Block* block,
                                                                         const std::string& name) {
    for (torch::jit::Node* node : block->nodes()) {
      const std::string kind = node->kind().toQualString();
      if (kind == "aten::_convolution") {
        ConvolutionNode conv{name, {}};
        for (torch::jit::Value* input : node->inputs()) {
          conv.constants.push_back(torch::jit::toIValue(input).value_or(c10::IValue()));
        }
        found.push_back(std::move(conv));
      } else if (kind.find("conv") != std::string::npos) {
        others->push_back(kind);
      }
      for (torch::jit::Block* nested : node->blocks()) walk(nested, name);
    }
  };
  for (torch::jit::Function* function : module._ivalue()->compilation_unit()->get_functions()) {
    if (auto* graph_function = torch::jit::tryToGraphFunction(*function)) {
      walk(graph_function->graph()->block(), function->qualname().qualifiedName());
    }
  }
  return found;
}

// Like a traced model: nested submodules whose forwards call aten::_convolution with the flags
// frozen at "trace time" (benchmark off, deterministic off, cuDNN on, TF32 on). The constants
// False and True are pooled on load: `transposed` shares them with the flags.
torch::jit::Module TracedLikeModel() {
  torch::manual_seed(3);
  torch::jit::Module conv("Conv");
  conv.register_parameter("weight", torch::randn({4, 3, 3, 3}), false);
  conv.register_parameter("bias", torch::randn({4}), false);
  conv.define(R"(
def forward(self, x):
    return torch._convolution(x, self.weight, self.bias, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, False, False, True, True)
)");
  torch::jit::Module up("Up");
  up.register_parameter("weight", torch::randn({4, 2, 2, 2}), false);
  up.define(R"(
def forward(self, x):
    return torch._convolution(x, self.weight, None, [2, 2], [0, 0], [1, 1], True, [0, 0], 1, False, False, True, True)
)");
  torch::jit::Module block("Block");
  block.register_module("conv", conv);
  block.register_module("up", up);
  block.define(R"(
def forward(self, x):
    return self.up.forward(torch.relu(self.conv.forward(x)))
)");
  torch::jit::Module model("Model");
  model.register_module("block", block);
  model.define(R"(
def forward(self, x):
    y = self.block.forward(x)
    if bool(y.sum() > 1000000.0):
        y = torch.conv2d(y, torch.ones([2, 2, 1, 1]), None, [1, 1], [0, 0], [1, 1], 1)
    return y
)");
  return model;
}

// Like a scripted nn.Conv2d / nn.ConvTranspose2d: aten::conv2d and aten::conv_transpose2d, the
// transposed one with stride, output_padding and dilation all different, so that an argument
// mapped to the wrong place changes the output.
constexpr char kScripted[] = R"(
def forward(self, x):
    w = torch.arange(54.0).reshape([2, 3, 3, 3]) * 0.01
    y = torch.conv2d(x, w, None, [1, 1], [1, 1], [1, 1], 1)
    t = torch.arange(8.0).reshape([2, 1, 2, 2]) * 0.5
    z = torch.conv_transpose2d(y, t, None, [3, 3], [1, 1], [2, 2], 1, [2, 2])
    return self.helper(z)

def helper(self, z):
    return torch.convolution(z, torch.ones([1, 1, 1, 1]), None, [1], [0], [1], False, [0], 1)
)";

torch::jit::Module SaveAndLoad(const torch::jit::Module& module, const std::string& name) {
  const auto path = std::filesystem::temp_directory_path() / (name + "_rewrite_test.pt");
  module.save(path.string());
  return torch::jit::load(path.string());
}

TEST(ConvolutionRewriteTest, TracedNestedModelCarriesTheDecisionAndComputesTheSame) {
  torch::jit::Module model = SaveAndLoad(TracedLikeModel(), "traced");
  model.eval();
  const torch::Tensor input = torch::randn({2, 3, 8, 8});
  const torch::Tensor before = model.forward({input}).toTensor();

  torch::jit::Module rewritten = SaveAndLoad(TracedLikeModel(), "traced");
  rewritten.eval();
  ConvolutionFlags flags;
  flags.benchmark = true;
  flags.deterministic = true;
  flags.allow_tf32 = false;
  ConvolutionTuning tuning = RewriteConvolutions(rewritten, flags);
  EXPECT_EQ(tuning.convolutions, 3);  // two submodule convolutions and one in a nested block
  EXPECT_EQ(tuning.rewritten, 3);
  EXPECT_TRUE(tuning.fallback.empty());

  std::vector<std::string> others;
  std::vector<ConvolutionNode> convolutions = Convolutions(rewritten, &others);
  // The scripted conv2d in the nested block stays as it was for an unbatched input only.
  EXPECT_THAT(others, ::testing::ElementsAre("aten::conv2d"));
  ASSERT_EQ(convolutions.size(), 3u);
  int transposed = 0;
  for (const ConvolutionNode& conv : convolutions) {
    ASSERT_EQ(conv.constants.size(), 13u) << conv.function;
    EXPECT_TRUE(conv.constants[9].toBool()) << conv.function << ": benchmark";
    EXPECT_TRUE(conv.constants[10].toBool()) << conv.function << ": deterministic";
    EXPECT_TRUE(conv.constants[11].toBool()) << conv.function << ": cudnn_enabled";
    EXPECT_FALSE(conv.constants[12].toBool()) << conv.function << ": allow_tf32";
    transposed += conv.constants[6].toBool() ? 1 : 0;
  }
  EXPECT_EQ(transposed, 1);  // the ConvTranspose keeps transposed=True; the others keep False

  const torch::Tensor after = rewritten.forward({input}).toTensor();
  EXPECT_TRUE(torch::equal(before, after));
  // The nested-block convolution runs too when its branch is taken.
  const torch::Tensor large = torch::full({1, 3, 8, 8}, 1000.0);
  EXPECT_TRUE(torch::allclose(SaveAndLoad(TracedLikeModel(), "traced").forward({large}).toTensor(),
                              rewritten.forward({large}).toTensor()));
}

TEST(ConvolutionRewriteTest, DecisionOffOverridesFlagsFrozenAtTraceTime) {
  torch::jit::Module model = SaveAndLoad(TracedLikeModel(), "traced_off");
  ConvolutionTuning tuning = RewriteConvolutions(model, ConvolutionFlags{});
  EXPECT_EQ(tuning.rewritten, 3);
  std::vector<std::string> others;
  for (const ConvolutionNode& conv : Convolutions(model, &others)) {
    EXPECT_FALSE(conv.constants[9].toBool());
    EXPECT_FALSE(conv.constants[10].toBool());
  }
}

TEST(ConvolutionRewriteTest, ScriptedConvolutionsAreRewrittenInEveryMethod) {
  const auto path = testing::SaveModule("scripted_convs", kScripted);
  torch::jit::Module original = torch::jit::load(path.string());
  torch::jit::Module model = torch::jit::load(path.string());
  ConvolutionFlags flags;
  flags.benchmark = true;
  ConvolutionTuning tuning = RewriteConvolutions(model, flags);
  EXPECT_EQ(tuning.convolutions, 3);
  EXPECT_EQ(tuning.rewritten, 3);
  std::vector<std::string> others;
  std::vector<ConvolutionNode> convolutions = Convolutions(model, &others);
  // conv2d and conv_transpose2d stay as they were in the branch for an unbatched input.
  EXPECT_THAT(others, ::testing::UnorderedElementsAre("aten::conv2d", "aten::conv_transpose2d"));
  ASSERT_EQ(convolutions.size(), 3u);
  for (const ConvolutionNode& conv : convolutions) EXPECT_TRUE(conv.constants[9].toBool());
  const torch::Tensor input = torch::randn({2, 3, 5, 5});
  EXPECT_TRUE(
      torch::allclose(original.forward({input}).toTensor(), model.forward({input}).toTensor()));
}

TEST(ConvolutionRewriteTest, UnbatchedInputToAScriptedConvolutionStillWorks) {
  const auto path = testing::SaveModule("unbatched_conv", R"(
def forward(self, x):
    return torch.conv2d(x, torch.ones([2, 3, 3, 3]), None, [1, 1], [1, 1], [1, 1], 1)
)");
  torch::jit::Module original = torch::jit::load(path.string());
  torch::jit::Module model = torch::jit::load(path.string());
  EXPECT_EQ(RewriteConvolutions(model, ConvolutionFlags{}).rewritten, 1);
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{3, 6, 6}, std::vector<int64_t>{2, 3, 6, 6}}) {
    const torch::Tensor input = torch::randn(shape);
    EXPECT_TRUE(
        torch::allclose(original.forward({input}).toTensor(), model.forward({input}).toTensor()))
        << "input rank " << shape.size();
  }
}

TEST(ConvolutionRewriteTest, StringPaddingCannotBeRewrittenAndSaysSo) {
  const auto path = testing::SaveModule("same_padding", R"(
def forward(self, x):
    return torch.conv2d(x, torch.ones([1, 1, 3, 3]), None, [1, 1], "same", [1, 1], 1)
)");
  torch::jit::Module model = torch::jit::load(path.string());
  ConvolutionTuning tuning = RewriteConvolutions(model, ConvolutionFlags{});
  EXPECT_EQ(tuning.convolutions, 1);
  EXPECT_EQ(tuning.rewritten, 0);
  EXPECT_THAT(tuning.fallback, HasSubstr("aten::conv2d"));
  EXPECT_THAT(tuning.fallback, HasSubstr("global"));
  EXPECT_EQ(model.forward({torch::ones({1, 1, 4, 4})}).toTensor().sizes(),
            (std::vector<int64_t>{1, 1, 4, 4}));
}

}  // namespace
}  // namespace sluice
