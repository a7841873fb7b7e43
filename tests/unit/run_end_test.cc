// Ending a run and keeping the model (server/run_end.h): which stop condition holds, the
// best checkpoint written only on an improvement and remembered across a restart (same
// evaluation data only), and checkpoint files read back with their damage and their model
// checked.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "model/model.h"
#include "server/run_end.h"
#include "tests/support/temp_dir.h"

namespace {

using namespace edgetrain;
using server::BestCheckpoint;
using server::EvaluationResult;
using server::StopConditions;

runtime::Model mlp() {
  runtime::Model model(runtime::builtin_model_spec("mlp"));
  model.initialize(7);
  return model;
}

EvaluationResult evaluation(std::uint64_t version, double accuracy, const runtime::Model& model,
                            float fill) {
  EvaluationResult result;
  result.version = version;
  result.accuracy = accuracy;
  result.loss = 1 - accuracy;
  result.parameters.assign(model.parameter_count(), fill);
  return result;
}

TEST(StopConditions, EachConditionHoldsAtItsThresholdOnly) {
  const StopConditions none({});
  EXPECT_FALSE(none.any());
  EXPECT_FALSE(none.check(1000000, 1e9));

  const StopConditions updates({0, 500, 0});
  EXPECT_FALSE(updates.check(499, 1e9));
  ASSERT_TRUE(updates.check(500, 0));
  EXPECT_EQ(updates.check(500, 0)->condition, "updates");

  const StopConditions seconds({0, 0, 30});
  EXPECT_FALSE(seconds.check(1000000, 29.9));
  EXPECT_EQ(seconds.check(0, 30)->condition, "seconds");

  StopConditions accuracy({0.9, 0, 0});
  const runtime::Model model = mlp();
  accuracy.note_evaluation(evaluation(10, 0.89, model, 0));
  EXPECT_FALSE(accuracy.check(10, 0));
  accuracy.note_evaluation(evaluation(20, 0.91, model, 0));
  accuracy.note_evaluation(evaluation(30, 0.5, model, 0));  // a later dip does not undo it
  const auto reason = accuracy.check(30, 0);
  ASSERT_TRUE(reason);
  EXPECT_EQ(reason->condition, "accuracy");
  EXPECT_NE(reason->detail.find("version 20"), std::string::npos) << reason->detail;
}

TEST(BestCheckpoint, WrittenOnImprovementAndRememberedForTheSameData) {
  edgetrain::testing::TempDir dir("edgetrain-best");
  std::filesystem::create_directories(dir.path());
  const runtime::Model model = mlp();
  {
    BestCheckpoint best(dir.path(), model, "mnist-small", {});
    EXPECT_FALSE(best.best());
    best.offer(evaluation(10, 0.5, model, 0.25f));
    best.offer(evaluation(20, 0.4, model, 0.5f));  // worse: the file keeps version 10
    ASSERT_TRUE(best.best());
    EXPECT_EQ(best.best()->version, 10u);
  }
  const server::CheckpointFile kept =
      server::read_checkpoint_file(dir.path() / "best.safetensors", "");
  EXPECT_EQ(kept.version, 10u);
  EXPECT_EQ(kept.metadata.at("edgetrain.test_accuracy"), "0.500000");
  EXPECT_EQ(kept.model.parameters()[0], 0.25f);

  BestCheckpoint restarted(dir.path(), model, "mnist-small", {});
  ASSERT_TRUE(restarted.best());
  EXPECT_EQ(restarted.best()->accuracy, 0.5);
  restarted.offer(evaluation(30, 0.45, model, 1.0f));
  EXPECT_EQ(server::read_checkpoint_file(dir.path() / "best.safetensors", "mlp").version, 10u);

  BestCheckpoint other_data(dir.path(), model, "fashion-mnist", {});
  EXPECT_FALSE(other_data.best());  // accuracy on other data does not compare
}

TEST(ReadCheckpointFile, RefusesDamageAndAnotherModel) {
  edgetrain::testing::TempDir dir("edgetrain-read-checkpoint");
  std::filesystem::create_directories(dir.path());
  const runtime::Model model = mlp();
  BestCheckpoint best(dir.path(), model, "mnist-small", {});
  best.offer(evaluation(3, 0.7, model, 0.5f));
  const auto path = dir.path() / "best.safetensors";
  EXPECT_EQ(server::read_checkpoint_file(path, "").model.spec().name, "mlp");
  EXPECT_THROW(server::read_checkpoint_file(path, "paper-cnn"), std::runtime_error);
  EXPECT_THROW(server::read_checkpoint_file(dir.path() / "missing.safetensors", ""),
               std::runtime_error);

  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  file.seekp(-5, std::ios::end);
  file.put('\x7f');
  file.close();
  try {
    server::read_checkpoint_file(path, "");
    ADD_FAILURE() << "a damaged checkpoint was read";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("damaged"), std::string::npos) << e.what();
  }
}

// A model given as spec text (--model 'input ...; fc 10'): its checkpoint names the spec, so
// it reads back without --model (issue 35), into the same layout and parameters.
TEST(ReadCheckpointFile, ASpecTextModelReadsBackWithoutModel) {
  edgetrain::testing::TempDir dir("edgetrain-read-spec-checkpoint");
  std::filesystem::create_directories(dir.path());
  const std::string text = "input 28x28x1; conv 4 3x3 same relu; maxpool 2; fc 10";
  runtime::Model model(runtime::model_spec_from_argument(text));
  model.initialize(3);
  BestCheckpoint best(dir.path(), model, "mnist-small", {});
  best.offer(evaluation(4, 0.6, model, 0.25f));
  const auto read = server::read_checkpoint_file(dir.path() / "best.safetensors", "");
  EXPECT_EQ(read.model.spec().name, text);
  EXPECT_EQ(read.model.layout_id(), model.layout_id());
  EXPECT_EQ(read.version, 4u);
  EXPECT_EQ(read.model.parameters()[0], 0.25f);
}

// --init-from's reading (read_start_file): a plain safetensors file with no edgetrain.crc32
// (what another tool writes) is read and said to be unsealed, where a checkpoint is refused
// as damaged; a sealed one is read as sealed; a checksum that is there and wrong is refused
// by both.
TEST(ReadStartFile, TakesAPlainSafetensorsFileAndSaysSo) {
  edgetrain::testing::TempDir dir("edgetrain-read-start");
  std::filesystem::create_directories(dir.path());
  runtime::Model model = mlp();
  model.initialize(5);
  const auto write = [&](const std::string& name, const std::vector<std::uint8_t>& bytes) {
    std::ofstream(dir.path() / name, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    return dir.path() / name;
  };
  const auto plain = write("plain.safetensors", model.safetensors_bytes({{"edgetrain.model", "mlp"}}));
  EXPECT_THROW(server::read_checkpoint_file(plain, ""), std::runtime_error);
  bool unsealed = false;
  const server::CheckpointFile start = server::read_start_file(plain, "", unsealed);
  EXPECT_TRUE(unsealed);
  EXPECT_EQ(start.model.parameters()[7], model.parameters()[7]);

  BestCheckpoint best(dir.path(), model, "mnist-small", {});
  best.offer(evaluation(2, 0.5, model, 0.125f));
  EXPECT_EQ(server::read_start_file(dir.path() / "best.safetensors", "", unsealed).version, 2u);
  EXPECT_FALSE(unsealed);

  const std::vector<std::uint8_t> wrong =
      model.safetensors_bytes({{"edgetrain.model", "mlp"}, {"edgetrain.crc32", "0badc0de"}});
  const auto tampered = write("tampered.safetensors", wrong);
  EXPECT_THROW(server::read_start_file(tampered, "", unsealed), std::runtime_error);
  EXPECT_THROW(server::read_start_file(dir.path() / "missing.safetensors", "", unsealed),
               std::runtime_error);
}

}  // namespace
