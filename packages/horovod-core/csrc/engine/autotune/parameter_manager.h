// The autotuner of global rank 0 (spec core.md §12). It scores the parameters in force by the
// allreduce bytes of the global process set per microsecond, and walks a chain of stages:
//   warm-up   the first HOROVOD_AUTOTUNE_WARMUP_SAMPLES scores of the initial parameters are
//             discarded;
//   initial   the next one is kept: the parameters the job started with are a candidate too, so
//             the search never settles on a configuration that scored worse than them (an
//             addition to upstream's chain);
//   joint     fusion threshold [0, 64] MB and cycle time [1, 100] ms together: four fixed test
//             points, then Bayesian optimisation (bayesian_optimization.h), for up to
//             HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES configurations; the best pair is kept;
//   hierarchical allreduce, then hierarchical allgather (off, then on; only on a job spanning
//             several hosts with the same number of ranks on each, where the engine built the
//             hierarchical communicators); each starts from the best configuration so far;
//   cache     the response cache off, then on;
//   done      the configuration with the best mean score over all stages is fixed.
// A variable the user set explicitly is left out of the search (a stage with nothing left to
// search is skipped). One score is the median of five samples; a sample ends when some tensor has
// been reduced STEPS_PER_SAMPLE more times. Each scored configuration is a row of the CSV log
// (HOROVOD_AUTOTUNE_LOG), and the last row is the configuration chosen, with its mean score.
//
// The engine calls Update after every cycle of the global set with the responses it executed;
// when Update returns parameters, the engine publishes them through the global set's controller,
// and every rank applies them at the same point of the next negotiation. The engine then calls
// Applied on rank 0, and measuring starts again.
#pragma once

#include <chrono>
#include <deque>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/config.h"
#include "common/message.h"
#include "bayesian_optimization.h"
#include "common/tuned_parameters.h"

namespace horovod {

class ParameterManager {
 public:
  using Clock = std::chrono::steady_clock;

  // `initial`: the parameters every rank starts with. `hierarchical`: whether the hierarchical
  // collectives exist in this job (then the ones the user did not set are searched). Throws
  // EngineError(INVALID_ARGUMENT) when the log file cannot be opened.
  ParameterManager(const Config& config, const TunedParameters& initial, bool hierarchical = false);

  // Accounts the global set's responses executed in one cycle (only allreduces count). Returns
  // the parameters to publish when the tuner moves on, with `tuning` false for the final ones.
  std::optional<TunedParameters> Update(const std::vector<Response>& executed, Clock::time_point now);
  // The published parameters are in force from `now`.
  void Applied(Clock::time_point now);

  bool tuning() const { return stage_ != Stage::DONE; }

  static constexpr int kSamplesPerScore = 5;
  // The joint stage's space and fixed first test points (fusion MB, cycle ms).
  static constexpr double kFusionMbLow = 0.0, kFusionMbHigh = 64.0;
  static constexpr double kCycleMsLow = 1.0, kCycleMsHigh = 100.0;

 private:
  enum class Stage { WARMUP, INITIAL, JOINT, HIERARCHICAL_ALLREDUCE, HIERARCHICAL_ALLGATHER, CACHE, DONE };

  // Scores the parameters in force with `score` and returns the next ones to publish, if any.
  std::optional<TunedParameters> Score(double score);
  // Moves to the next configuration of the chain (or to the end) and returns it.
  TunedParameters Advance();
  // The scored configuration with the highest mean score, and that mean (scored_ not empty).
  std::pair<TunedParameters, double> Best() const;
  void WriteRow(const TunedParameters& p, double score);
  std::vector<double> JointPoint(const TunedParameters& p) const;
  bool InJointSpace(const TunedParameters& p) const;

  const bool tune_fusion_, tune_cycle_, tune_cache_;
  const int64_t steps_per_sample_;
  int64_t warmup_left_;
  int64_t joint_left_;
  size_t test_points_used_ = 0;
  std::unique_ptr<BayesianOptimization> optimizer_;
  std::deque<bool> hierarchical_allreduce_values_;
  std::deque<bool> hierarchical_allgather_values_;
  std::deque<bool> cache_values_;
  Stage stage_ = Stage::WARMUP;
  bool started_ = false;
  bool waiting_for_apply_ = false;
  TunedParameters current_;
  std::vector<std::pair<TunedParameters, double>> scored_;

  // The sample being measured.
  std::unordered_map<std::string, int64_t> reductions_;  // per tensor name, since the parameters applied
  int sample_ = 0;
  double sample_bytes_ = 0.0;
  Clock::time_point sample_start_;
  std::vector<double> sample_scores_;

  std::ofstream log_;
};

}  // namespace horovod
