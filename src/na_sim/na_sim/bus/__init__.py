"""Protocol-accurate Dynamixel (Protocol 2.0) and Feetech (SCS/STS) servo-bus emulators on a pty."""

from na_sim.bus.backend import ArmBackend, ServoState, StaticBackend
from na_sim.bus.emulator import BusEmulator, BusStats, FaultSpec, make_emulator

__all__ = ["ArmBackend", "BusEmulator", "BusStats", "FaultSpec", "ServoState", "StaticBackend", "make_emulator"]
