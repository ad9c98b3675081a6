// Gaussian-process regression with a squared-exponential kernel, following Rasmussen & Williams,
// "Gaussian Processes for Machine Learning" (MIT Press, 2006), Algorithm 2.1: a Cholesky
// factorisation of K + noise^2 I gives the predictive mean, variance and log marginal likelihood.
// The linear algebra is Eigen's.
#pragma once

#include <Eigen/Cholesky>
#include <Eigen/Core>

namespace horovod {

class GaussianProcess {
 public:
  // `noise`: standard deviation of the observation noise, in units of the targets' standard
  // deviation (targets are standardised by Fit).
  explicit GaussianProcess(double noise) : noise_(noise) {}

  // Fits to `x` (one sample per row, inputs scaled to [0, 1]) and `y` (one target per sample;
  // at least one sample). The kernel length scale is the one of a fixed log-spaced grid that
  // maximises the log marginal likelihood (Rasmussen & Williams eq. 2.30).
  void Fit(const Eigen::MatrixXd& x, const Eigen::VectorXd& y);

  // Predictive mean and standard deviation at `x` in the targets' units, with their gradients
  // with respect to `x` (pass nullptr for gradients that are not needed).
  void Predict(const Eigen::VectorXd& x, double* mean, double* stddev, Eigen::VectorXd* mean_gradient = nullptr,
               Eigen::VectorXd* stddev_gradient = nullptr) const;

  double length_scale() const { return length_scale_; }

 private:
  // Factorises the kernel matrix for `length_scale`; returns the log marginal likelihood of the
  // standardised targets.
  double Factorise(double length_scale);
  double Kernel(const Eigen::VectorXd& a, const Eigen::VectorXd& b) const;

  double noise_;
  double length_scale_ = 0.25;
  double y_mean_ = 0.0, y_scale_ = 1.0;
  Eigen::MatrixXd x_;
  Eigen::VectorXd y_;  // standardised targets
  Eigen::LLT<Eigen::MatrixXd> llt_;
  Eigen::VectorXd alpha_;  // (K + noise^2 I)^-1 y
};

}  // namespace horovod
