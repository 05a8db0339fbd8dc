"""Servo bus drivers (Feetech STS3215, Dynamixel XM430), Franka bridge, twin-arm teleop and NAD recorder for NeuralActuator."""
