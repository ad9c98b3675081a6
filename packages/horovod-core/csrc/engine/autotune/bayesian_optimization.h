// Bayesian optimisation of a noisy score over a box: a Gaussian-process model of the samples seen
// so far (gaussian_process.h) and, as the next point to try, the maximiser of the expected
// improvement over the best sample (Jones, Schonlau & Welch, "Efficient Global Optimization of
// Expensive Black-Box Functions", J. Global Optimization 13, 1998; with the exploration margin xi
// of Snoek, Larochelle & Adams, "Practical Bayesian Optimization of Machine Learning Algorithms",
// NeurIPS 2012). The acquisition is maximised with L-BFGS-B (the LBFGS++ library) from several
// random starting points.
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "gaussian_process.h"

namespace horovod {

class BayesianOptimization {
 public:
  // `bounds`: [low, high] of each dimension (low < high). `noise`: the Gaussian process's noise
  // (HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE). `xi`: how much an improvement must exceed the best
  // sample, in units of the scores' standard deviation. `seed` makes the restarts reproducible.
  BayesianOptimization(std::vector<std::pair<double, double>> bounds, double noise, double xi = 0.01,
                       uint64_t seed = 1);

  // Records that the score at `x` (within the bounds, one value per dimension) was `score`.
  void AddSample(const std::vector<double>& x, double score);
  // The point to try next: the maximiser of the expected improvement, or the centre of the box
  // before any sample was added.
  std::vector<double> NextSample();

  // Expected improvement at `x` (in the box's units) under the current model; for tests.
  double ExpectedImprovement(const std::vector<double>& x);
  size_t num_samples() const { return scores_.size(); }

 private:
  // EI at a point of the unit box, with its gradient there when `gradient` is not null.
  double UnitExpectedImprovement(const Eigen::VectorXd& u, Eigen::VectorXd* gradient) const;
  void Refit();

  std::vector<std::pair<double, double>> bounds_;
  double xi_;
  GaussianProcess gp_;
  bool fitted_ = false;
  double best_mean_ = 0.0;  // the best sample's predicted mean: the incumbent EI improves on
  double score_scale_ = 1.0;
  std::vector<Eigen::VectorXd> points_;  // samples, scaled to the unit box
  std::vector<double> scores_;
  std::mt19937_64 rng_;
};

}  // namespace horovod
