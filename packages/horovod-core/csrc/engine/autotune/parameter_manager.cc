#include "parameter_manager.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <sstream>

#include "common/common.h"
#include "common/logging.h"

namespace horovod {

namespace {

constexpr double kBytesPerMb = 1024.0 * 1024.0;
// The joint stage's first configurations (fusion MB, cycle ms), before the model proposes any.
constexpr double kTestPoints[][2] = {{4, 5}, {32, 50}, {16, 25}, {8, 10}};

std::string Describe(const TunedParameters& p) {
  std::ostringstream out;
  out << "fusion threshold " << p.fusion_threshold_bytes / kBytesPerMb << " MB, cycle time " << p.cycle_time_ms
      << " ms, hierarchical allreduce " << (p.hierarchical_allreduce ? "on" : "off") << ", hierarchical allgather "
      << (p.hierarchical_allgather ? "on" : "off") << ", response cache " << (p.cache_enabled ? "on" : "off");
  return out.str();
}

}  // namespace

ParameterManager::ParameterManager(const Config& config, const TunedParameters& initial, bool hierarchical)
    : tune_fusion_(!config.fusion_threshold_fixed),
      tune_cycle_(!config.cycle_time_fixed),
      tune_cache_(!config.cache_capacity_fixed),
      steps_per_sample_(std::max<int64_t>(config.autotune_steps_per_sample, 1)),
      warmup_left_(config.autotune_warmup_samples),
      joint_left_(tune_fusion_ || tune_cycle_ ? config.autotune_bayes_opt_max_samples : 0),
      current_(initial) {
  current_.tuning = true;
  std::vector<std::pair<double, double>> bounds;
  if (tune_fusion_) bounds.emplace_back(kFusionMbLow, kFusionMbHigh);
  if (tune_cycle_) bounds.emplace_back(kCycleMsLow, kCycleMsHigh);
  if (!bounds.empty()) {
    optimizer_ = std::make_unique<BayesianOptimization>(bounds, config.autotune_gaussian_process_noise);
  }
  const bool tune_hierarchical_allreduce = hierarchical && !config.hierarchical_allreduce_fixed;
  const bool tune_hierarchical_allgather = hierarchical && !config.hierarchical_allgather_fixed;
  if (tune_hierarchical_allreduce) hierarchical_allreduce_values_ = {false, true};
  if (tune_hierarchical_allgather) hierarchical_allgather_values_ = {false, true};
  if (tune_cache_) cache_values_ = {false, true};
  if (!config.autotune_log.empty()) {
    log_.open(config.autotune_log, std::ios::out | std::ios::trunc);
    if (!log_) {
      throw EngineError(Status::InvalidArgument("Cannot open the autotune log file '" + config.autotune_log +
                                                "' (HOROVOD_AUTOTUNE_LOG) for writing."));
    }
    log_ << "hierarchical_allreduce,hierarchical_allgather,torus_allreduce,cache_enabled,cycle_time_ms,"
            "tensor_fusion_threshold,score\n";
    log_.flush();
  }
  std::string searched, fixed;
  auto add = [](std::string& list, const char* name) { list += (list.empty() ? "" : ", ") + std::string(name); };
  add(tune_fusion_ ? searched : fixed, "fusion threshold");
  add(tune_cycle_ ? searched : fixed, "cycle time");
  if (hierarchical) {
    add(tune_hierarchical_allreduce ? searched : fixed, "hierarchical allreduce");
    add(tune_hierarchical_allgather ? searched : fixed, "hierarchical allgather");
  }
  add(tune_cache_ ? searched : fixed, "response cache");
  HVD_LOG(INFO) << "Autotune: searching " << (searched.empty() ? "nothing" : searched) << "; fixed by the user: "
                << (fixed.empty() ? "nothing" : fixed) << ". Warm-up samples " << warmup_left_ << ", steps per sample "
                << steps_per_sample_ << ", Bayesian optimisation samples " << joint_left_ << ", noise "
                << config.autotune_gaussian_process_noise << ".";
}

std::vector<double> ParameterManager::JointPoint(const TunedParameters& p) const {
  std::vector<double> point;
  if (tune_fusion_) point.push_back(static_cast<double>(p.fusion_threshold_bytes) / kBytesPerMb);
  if (tune_cycle_) point.push_back(p.cycle_time_ms);
  return point;
}

bool ParameterManager::InJointSpace(const TunedParameters& p) const {
  const double mb = static_cast<double>(p.fusion_threshold_bytes) / kBytesPerMb;
  return (!tune_fusion_ || (mb >= kFusionMbLow && mb <= kFusionMbHigh)) &&
         (!tune_cycle_ || (p.cycle_time_ms >= kCycleMsLow && p.cycle_time_ms <= kCycleMsHigh));
}

void ParameterManager::WriteRow(const TunedParameters& p, double score) {
  if (!log_.is_open()) return;
  log_ << int(p.hierarchical_allreduce) << ',' << int(p.hierarchical_allgather) << ',' << int(p.torus_allreduce) << ','
       << int(p.cache_enabled) << ',' << p.cycle_time_ms << ',' << p.fusion_threshold_bytes / kBytesPerMb << ','
       << score << '\n';
  log_.flush();
}

std::optional<TunedParameters> ParameterManager::Update(const std::vector<Response>& executed,
                                                        Clock::time_point now) {
  if (stage_ == Stage::DONE || waiting_for_apply_) return std::nullopt;
  if (!started_) {
    started_ = true;
    sample_start_ = now;
    if (joint_left_ == 0 && hierarchical_allreduce_values_.empty() && hierarchical_allgather_values_.empty() &&
        cache_values_.empty()) {
      return Advance();
    }
    if (warmup_left_ == 0) stage_ = Stage::INITIAL;
  }
  bool sample_done = false;
  for (const Response& response : executed) {
    if (response.type != OpType::ALLREDUCE) continue;
    int64_t elements = 0;
    for (int64_t n : response.tensor_sizes) elements += n;
    sample_bytes_ += static_cast<double>(elements) * static_cast<double>(DataTypeSize(response.dtype));
    for (const std::string& name : response.names) {
      if (++reductions_[name] >= (sample_ + 1) * steps_per_sample_) sample_done = true;
    }
  }
  if (!sample_done) return std::nullopt;
  const double micros =
      std::max<double>(std::chrono::duration_cast<std::chrono::microseconds>(now - sample_start_).count(), 1.0);
  sample_scores_.push_back(sample_bytes_ / micros);
  sample_bytes_ = 0.0;
  sample_start_ = now;
  if (++sample_ < kSamplesPerScore) return std::nullopt;
  std::nth_element(sample_scores_.begin(), sample_scores_.begin() + kSamplesPerScore / 2, sample_scores_.end());
  const double median = sample_scores_[kSamplesPerScore / 2];
  sample_ = 0;
  sample_scores_.clear();
  reductions_.clear();
  return Score(median);
}

void ParameterManager::Applied(Clock::time_point now) {
  waiting_for_apply_ = false;
  reductions_.clear();
  sample_ = 0;
  sample_bytes_ = 0.0;
  sample_scores_.clear();
  sample_start_ = now;
}

std::optional<TunedParameters> ParameterManager::Score(double score) {
  if (stage_ == Stage::WARMUP) {
    --warmup_left_;
    HVD_LOG(INFO) << "Autotune: warm-up score " << score << " bytes/us discarded; " << warmup_left_
                  << " warm-up samples left.";
    // The initial parameters stay in force for their own score.
    if (warmup_left_ == 0) stage_ = Stage::INITIAL;
    return std::nullopt;
  }
  scored_.emplace_back(current_, score);
  WriteRow(current_, score);
  HVD_LOG(INFO) << "Autotune: " << Describe(current_) << ": score " << score << " bytes/us.";
  const bool model_it = stage_ == Stage::JOINT || (stage_ == Stage::INITIAL && InJointSpace(current_));
  if (model_it && optimizer_) optimizer_->AddSample(JointPoint(current_), score);
  return Advance();
}

std::pair<TunedParameters, double> ParameterManager::Best() const {
  // Mean score per distinct configuration: one measured more than once (the optimisation may
  // propose a point again, or one within rounding of a measured one; the cache stage measures the
  // best pair again) is judged on all its scores rather than on its luckiest one.
  auto same = [](const TunedParameters& a, const TunedParameters& b) {
    auto close = [](double x, double y) { return std::abs(x - y) <= 1e-5 * std::max(std::abs(x), std::abs(y)); };
    TunedParameters b_as_a = b;
    b_as_a.fusion_threshold_bytes = a.fusion_threshold_bytes;
    b_as_a.cycle_time_ms = a.cycle_time_ms;
    return b_as_a == a && close(a.cycle_time_ms, b.cycle_time_ms) &&
           std::abs(a.fusion_threshold_bytes - b.fusion_threshold_bytes) <=
               1 + 1e-5 * std::max(a.fusion_threshold_bytes, b.fusion_threshold_bytes);
  };
  std::vector<std::pair<TunedParameters, std::pair<double, int>>> sums;
  for (const auto& [p, score] : scored_) {
    auto it = std::find_if(sums.begin(), sums.end(), [&](const auto& entry) { return same(entry.first, p); });
    if (it == sums.end()) {
      sums.push_back({p, {score, 1}});
    } else {
      it->second.first += score;
      it->second.second += 1;
    }
  }
  std::pair<TunedParameters, double> best{sums[0].first, -1.0};
  for (const auto& [p, sum] : sums) {
    const double mean = sum.first / sum.second;
    if (mean > best.second) best = {p, mean};
  }
  return best;
}

TunedParameters ParameterManager::Advance() {
  waiting_for_apply_ = true;
  if (joint_left_ > 0) {
    stage_ = Stage::JOINT;
    --joint_left_;
    std::vector<double> point;
    if (test_points_used_ < std::size(kTestPoints)) {
      const double* test = kTestPoints[test_points_used_++];
      if (tune_fusion_) point.push_back(test[0]);
      if (tune_cycle_) point.push_back(test[1]);
    } else {
      point = optimizer_->NextSample();
    }
    size_t d = 0;
    if (tune_fusion_) current_.fusion_threshold_bytes = std::llround(point[d++] * kBytesPerMb);
    if (tune_cycle_) current_.cycle_time_ms = point[d++];
    return current_;
  }
  if ((stage_ == Stage::JOINT || stage_ == Stage::INITIAL) && !scored_.empty()) {
    // The categorical stages start from the best pair.
    const TunedParameters best = Best().first;
    current_.fusion_threshold_bytes = best.fusion_threshold_bytes;
    current_.cycle_time_ms = best.cycle_time_ms;
  }
  // Each categorical stage starts from the best configuration so far: once a stage has tried
  // its values, its variable keeps the best one for the stages after it.
  if (stage_ == Stage::HIERARCHICAL_ALLREDUCE && hierarchical_allreduce_values_.empty()) {
    current_.hierarchical_allreduce = Best().first.hierarchical_allreduce;
  }
  if (stage_ == Stage::HIERARCHICAL_ALLGATHER && hierarchical_allgather_values_.empty()) {
    current_.hierarchical_allgather = Best().first.hierarchical_allgather;
  }
  if (!hierarchical_allreduce_values_.empty()) {
    stage_ = Stage::HIERARCHICAL_ALLREDUCE;
    current_.hierarchical_allreduce = hierarchical_allreduce_values_.front();
    hierarchical_allreduce_values_.pop_front();
    return current_;
  }
  if (!hierarchical_allgather_values_.empty()) {
    stage_ = Stage::HIERARCHICAL_ALLGATHER;
    current_.hierarchical_allgather = hierarchical_allgather_values_.front();
    hierarchical_allgather_values_.pop_front();
    return current_;
  }
  if (!cache_values_.empty()) {
    stage_ = Stage::CACHE;
    current_.cache_enabled = cache_values_.front();
    cache_values_.pop_front();
    return current_;
  }
  stage_ = Stage::DONE;
  if (!scored_.empty()) {
    const auto [best, score] = Best();
    current_ = best;
    current_.tuning = false;
    WriteRow(current_, score);
    HVD_LOG(INFO) << "Autotune: done; best " << Describe(current_) << " (score " << score << " bytes/us).";
  } else {
    current_.tuning = false;
    HVD_LOG(INFO) << "Autotune: nothing to tune; keeping " << Describe(current_) << ".";
  }
  return current_;
}

}  // namespace horovod
