"""Launch files, parameter files, RViz config and the na-bringup runner for the NeuralActuator stack."""
