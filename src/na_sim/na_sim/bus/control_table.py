"""Servo control-table memory and the integer encodings servos use on the wire.

A control table is a byte array addressed like the datasheet's table; multi-byte registers are
little endian (Dynamixel Protocol 2.0 and Feetech STS with protocol_end 0 both are).
"""

from __future__ import annotations

from collections.abc import Mapping

from na_description.robot_table import Register


def to_sign_magnitude(value: int, sign_bit: int) -> int:
    """Feetech encoding: magnitude in the low bits, ``sign_bit`` set when negative (saturates)."""
    limit = (1 << sign_bit) - 1
    magnitude = min(abs(int(value)), limit)
    return magnitude | (1 << sign_bit) if value < 0 else magnitude


def from_sign_magnitude(raw: int, sign_bit: int) -> int:
    magnitude = raw & ((1 << sign_bit) - 1)
    return -magnitude if raw & (1 << sign_bit) else magnitude


def to_twos_complement(value: int, size: int) -> int:
    """Dynamixel encoding of a signed value in ``size`` bytes (saturates to the range)."""
    bits = 8 * size
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return max(lo, min(hi, int(value))) & ((1 << bits) - 1)


def from_twos_complement(raw: int, size: int) -> int:
    bits = 8 * size
    return raw - (1 << bits) if raw & (1 << (bits - 1)) else raw


def saturate_unsigned(value: int, size: int) -> int:
    return max(0, min((1 << (8 * size)) - 1, int(value)))


class ControlTable:
    """The byte memory of one servo plus named access to its registers."""

    def __init__(self, size: int, registers: Mapping[str, Register]) -> None:
        self.memory = bytearray(size)
        self.registers = dict(registers)

    @property
    def size(self) -> int:
        return len(self.memory)

    def read(self, address: int, length: int) -> bytes:
        return bytes(self.memory[address : address + length])

    def write(self, address: int, data: bytes) -> None:
        self.memory[address : address + len(data)] = data

    def get(self, name: str) -> int:
        """Unsigned little-endian value of register ``name``."""
        reg = self.registers[name]
        return int.from_bytes(self.memory[reg.address : reg.address + reg.size], "little")

    def set(self, name: str, value: int) -> None:
        """Store the unsigned value ``value`` (already encoded) into register ``name``."""
        reg = self.registers[name]
        self.memory[reg.address : reg.address + reg.size] = (int(value) & ((1 << (8 * reg.size)) - 1)).to_bytes(
            reg.size, "little"
        )

    def has(self, name: str) -> bool:
        return name in self.registers

    def overlaps(self, name: str, address: int, length: int) -> bool:
        """Does the byte range [address, address+length) touch register ``name``?"""
        reg = self.registers.get(name)
        return reg is not None and address < reg.address + reg.size and reg.address < address + length
