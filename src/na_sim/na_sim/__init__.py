"""Simulated arms (MuJoCo + servo actuator physics) behind protocol-accurate Dynamixel and Feetech bus emulators; synthetic NAD data."""
