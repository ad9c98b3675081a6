// horovod.common._core.testing: parts of the engine exposed on their own for Python tests only.
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/vector.h>

#include "engine/autotune/bayesian_optimization.h"

namespace nb = nanobind;

namespace horovod::bindings {

void DefineTesting(nb::module_& parent) {
  nb::module_ m = parent.def_submodule("testing", "Parts of the engine for tests; not an API.");
  // The autotuner's optimiser on its own, so that tests can check it against known functions.
  nb::class_<BayesianOptimization>(m, "BayesianOptimization")
      .def("__init__", [](BayesianOptimization* self, std::vector<std::pair<double, double>> bounds, double noise,
                          double xi, uint64_t seed) {
        try {
          new (self) BayesianOptimization(std::move(bounds), noise, xi, seed);
        } catch (const std::invalid_argument& e) {
          throw nb::value_error(e.what());
        }
      }, nb::arg("bounds"), nb::arg("noise"), nb::arg("xi") = 0.01, nb::arg("seed") = 1)
      .def("add_sample", [](BayesianOptimization& self, const std::vector<double>& x, double score) {
        try {
          self.AddSample(x, score);
        } catch (const std::invalid_argument& e) {
          throw nb::value_error(e.what());
        }
      }, nb::arg("x"), nb::arg("score"))
      .def("next_sample", &BayesianOptimization::NextSample)
      .def("expected_improvement", &BayesianOptimization::ExpectedImprovement, nb::arg("x"))
      .def_prop_ro("num_samples", &BayesianOptimization::num_samples);
}

}  // namespace horovod::bindings
