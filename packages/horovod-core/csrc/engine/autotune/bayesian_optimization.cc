#include "bayesian_optimization.h"

#include <LBFGSB.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#include <stdexcept>

namespace horovod {

namespace {

double NormalPdf(double z) { return std::exp(-0.5 * z * z) / std::sqrt(2 * M_PI); }
double NormalCdf(double z) { return 0.5 * std::erfc(-z / std::sqrt(2.0)); }

// Random points of the unit box scored before the local searches; the best few start them.
constexpr int kCandidates = 256;
constexpr int kRestarts = 5;

}  // namespace

BayesianOptimization::BayesianOptimization(std::vector<std::pair<double, double>> bounds, double noise, double xi,
                                           uint64_t seed)
    : bounds_(std::move(bounds)), xi_(xi), gp_(noise), rng_(seed) {
  if (bounds_.empty()) throw std::invalid_argument("BayesianOptimization: no dimension to search");
  for (const auto& [low, high] : bounds_) {
    if (!(low < high)) throw std::invalid_argument("BayesianOptimization: each bound needs low < high");
  }
}

void BayesianOptimization::AddSample(const std::vector<double>& x, double score) {
  if (x.size() != bounds_.size()) throw std::invalid_argument("BayesianOptimization: sample of the wrong dimension");
  Eigen::VectorXd u(x.size());
  for (size_t d = 0; d < x.size(); ++d) {
    const auto& [low, high] = bounds_[d];
    u(d) = std::clamp((x[d] - low) / (high - low), 0.0, 1.0);
  }
  points_.push_back(u);
  scores_.push_back(score);
  fitted_ = false;
}

void BayesianOptimization::Refit() {
  if (fitted_) return;
  const Eigen::Index n = static_cast<Eigen::Index>(points_.size());
  Eigen::MatrixXd x(n, static_cast<Eigen::Index>(bounds_.size()));
  Eigen::VectorXd y(n);
  for (Eigen::Index i = 0; i < n; ++i) {
    x.row(i) = points_[i].transpose();
    y(i) = scores_[i];
  }
  gp_.Fit(x, y);
  const double mean = y.mean();
  const double variance = (y.array() - mean).square().mean();
  score_scale_ = variance > 0 ? std::sqrt(variance) : 1.0;
  // With noisy scores the incumbent is the best predicted mean at a sample rather than the best
  // raw score, which may be an outlier.
  best_mean_ = -std::numeric_limits<double>::infinity();
  for (const Eigen::VectorXd& p : points_) {
    double m, s;
    gp_.Predict(p, &m, &s);
    best_mean_ = std::max(best_mean_, m);
  }
  fitted_ = true;
}

double BayesianOptimization::UnitExpectedImprovement(const Eigen::VectorXd& u, Eigen::VectorXd* gradient) const {
  double mean, stddev;
  Eigen::VectorXd mean_gradient, stddev_gradient;
  gp_.Predict(u, &mean, &stddev, gradient ? &mean_gradient : nullptr, gradient ? &stddev_gradient : nullptr);
  const double improvement = mean - best_mean_ - xi_ * score_scale_;
  if (stddev <= 1e-12 * score_scale_) {
    if (gradient) *gradient = Eigen::VectorXd::Zero(u.size());
    return std::max(improvement, 0.0);
  }
  const double z = improvement / stddev;
  const double cdf = NormalCdf(z), pdf = NormalPdf(z);
  // dEI/dmean = Phi(z) and dEI/dstddev = phi(z).
  if (gradient) *gradient = cdf * mean_gradient + pdf * stddev_gradient;
  return improvement * cdf + stddev * pdf;
}

double BayesianOptimization::ExpectedImprovement(const std::vector<double>& x) {
  if (points_.empty()) return 0.0;
  Refit();
  Eigen::VectorXd u(x.size());
  for (size_t d = 0; d < x.size(); ++d) u(d) = (x[d] - bounds_[d].first) / (bounds_[d].second - bounds_[d].first);
  return UnitExpectedImprovement(u, nullptr);
}

std::vector<double> BayesianOptimization::NextSample() {
  const Eigen::Index dims = static_cast<Eigen::Index>(bounds_.size());
  Eigen::VectorXd best_u = Eigen::VectorXd::Constant(dims, 0.5);
  if (!points_.empty()) {
    Refit();
    std::uniform_real_distribution<double> uniform(0.0, 1.0);
    std::vector<std::pair<double, Eigen::VectorXd>> candidates;
    for (int i = 0; i < kCandidates; ++i) {
      Eigen::VectorXd u(dims);
      for (Eigen::Index d = 0; d < dims; ++d) u(d) = uniform(rng_);
      candidates.emplace_back(UnitExpectedImprovement(u, nullptr), u);
    }
    std::partial_sort(candidates.begin(), candidates.begin() + kRestarts, candidates.end(),
                      [](const auto& a, const auto& b) { return a.first > b.first; });
    double best_ei = candidates[0].first;
    best_u = candidates[0].second;

    LBFGSpp::LBFGSBParam<double> param;
    param.max_iterations = 100;
    LBFGSpp::LBFGSBSolver<double> solver(param);
    const Eigen::VectorXd lower = Eigen::VectorXd::Zero(dims), upper = Eigen::VectorXd::Ones(dims);
    auto negative_ei = [this](const Eigen::VectorXd& u, Eigen::VectorXd& gradient) {
      Eigen::VectorXd g;
      const double ei = UnitExpectedImprovement(u, &g);
      gradient = -g;
      return -ei;
    };
    for (int r = 0; r < kRestarts; ++r) {
      Eigen::VectorXd u = candidates[r].second;
      double value = 0.0;
      try {
        solver.minimize(negative_ei, u, value, lower, upper);
      } catch (const std::exception&) {
        // A line search that cannot progress (flat acquisition) leaves the last point; score it.
      }
      u = u.cwiseMax(lower).cwiseMin(upper);
      const double ei = UnitExpectedImprovement(u, nullptr);
      if (std::isfinite(ei) && ei > best_ei) {
        best_ei = ei;
        best_u = u;
      }
    }
  }
  std::vector<double> x(dims);
  for (Eigen::Index d = 0; d < dims; ++d) {
    const auto& [low, high] = bounds_[d];
    x[d] = low + best_u(d) * (high - low);
  }
  return x;
}

}  // namespace horovod
