#include "gaussian_process.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace horovod {

namespace {
// Added to the diagonal so that the factorisation exists with zero noise and repeated inputs.
constexpr double kJitter = 1e-9;
}  // namespace

double GaussianProcess::Kernel(const Eigen::VectorXd& a, const Eigen::VectorXd& b) const {
  return std::exp(-(a - b).squaredNorm() / (2.0 * length_scale_ * length_scale_));
}

double GaussianProcess::Factorise(double length_scale) {
  length_scale_ = length_scale;
  const Eigen::Index n = x_.rows();
  Eigen::MatrixXd k(n, n);
  for (Eigen::Index i = 0; i < n; ++i) {
    for (Eigen::Index j = 0; j <= i; ++j) k(i, j) = k(j, i) = Kernel(x_.row(i).transpose(), x_.row(j).transpose());
  }
  k.diagonal().array() += noise_ * noise_ + kJitter;
  llt_.compute(k);
  if (llt_.info() != Eigen::Success) return -std::numeric_limits<double>::infinity();
  alpha_ = llt_.solve(y_);
  // log p(y | X) = -y^T alpha / 2 - sum log L_ii - n log(2 pi) / 2
  const Eigen::MatrixXd l = llt_.matrixL();
  return -0.5 * y_.dot(alpha_) - l.diagonal().array().log().sum() - 0.5 * static_cast<double>(n) * std::log(2 * M_PI);
}

void GaussianProcess::Fit(const Eigen::MatrixXd& x, const Eigen::VectorXd& y) {
  if (x.rows() == 0 || x.rows() != y.size()) throw std::invalid_argument("GaussianProcess::Fit: bad sample shapes");
  x_ = x;
  y_mean_ = y.mean();
  const double variance = (y.array() - y_mean_).square().mean();
  y_scale_ = variance > 0 ? std::sqrt(variance) : 1.0;
  y_ = (y.array() - y_mean_) / y_scale_;
  double best_length = 0.0, best_likelihood = -std::numeric_limits<double>::infinity();
  for (double length = 0.05; length <= 2.0; length *= 1.25) {
    const double likelihood = Factorise(length);
    if (likelihood > best_likelihood) {
      best_likelihood = likelihood;
      best_length = length;
    }
  }
  if (best_length == 0.0) throw std::runtime_error("GaussianProcess::Fit: the kernel matrix is not positive definite");
  Factorise(best_length);
}

void GaussianProcess::Predict(const Eigen::VectorXd& x, double* mean, double* stddev, Eigen::VectorXd* mean_gradient,
                              Eigen::VectorXd* stddev_gradient) const {
  const Eigen::Index n = x_.rows();
  Eigen::VectorXd k_star(n);
  for (Eigen::Index i = 0; i < n; ++i) k_star(i) = Kernel(x, x_.row(i).transpose());
  const Eigen::VectorXd v = llt_.matrixL().solve(k_star);
  const double variance = std::max(1.0 - v.squaredNorm(), 0.0);
  const double sd = std::sqrt(variance);
  *mean = y_mean_ + y_scale_ * k_star.dot(alpha_);
  *stddev = y_scale_ * sd;
  if (!mean_gradient && !stddev_gradient) return;
  // d k(x, x_i) / dx = -k(x, x_i) (x - x_i) / l^2, one column per sample.
  Eigen::MatrixXd dk(x.size(), n);
  for (Eigen::Index i = 0; i < n; ++i) {
    dk.col(i) = -k_star(i) * (x - x_.row(i).transpose()) / (length_scale_ * length_scale_);
  }
  if (mean_gradient) *mean_gradient = y_scale_ * dk * alpha_;
  if (stddev_gradient) {
    // d var / dx = -2 dk (K^-1 k*); d sd / dx = (d var / dx) / (2 sd).
    if (sd > 1e-12) {
      *stddev_gradient = -y_scale_ * (dk * llt_.solve(k_star)) / sd;
    } else {
      *stddev_gradient = Eigen::VectorXd::Zero(x.size());
    }
  }
}

}  // namespace horovod
