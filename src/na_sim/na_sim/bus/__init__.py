"""Protocol-accurate Dynamixel (Protocol 2.0) and Feetech (SCS/STS) servo-bus emulators on a pty."""

from na_sim.bus.backend import ArmBackend, ServoState, StaticBackend

__all__ = ["ArmBackend", "ServoState", "StaticBackend"]
