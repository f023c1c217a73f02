/// Text from a peer or the file system as it may reach a text log or a terminal: every control character escaped, so
/// that a string can neither start a line of its own (a forged log entry) nor move the cursor, clear the screen or
/// reorder what follows it (SPEC §12.4).
///
/// Escaped: C0 controls and DEL (`\n`, `\r`, `\t`, else `\u{1b}` as `\u001b`), C1 controls (`\u0085`), the
/// bidirectional controls (U+061C, U+200E, U+200F, U+202A–U+202E, U+2066–U+2069: `photo\u202egpj.exe` must not show
/// as `photoexe.jpg`), the line and paragraph separators (U+2028, U+2029), and the backslash itself (`\\`), so that
/// an escape in the output always stands for a character in the input. Bytes that are not UTF-8 show as `\xNN`.
public enum Printable {
    /// `text` with every character a log or terminal would act on escaped.
    public static func escaped(_ text: String) -> String {
        // Most text needs nothing: returned as it is, without a copy.
        guard text.unicodeScalars.contains(where: Self.needsEscape) else { return text }
        var out = ""
        out.reserveCapacity(text.utf8.count + 8)
        for scalar in text.unicodeScalars {
            Self.append(scalar, to: &out)
        }
        return out
    }

    /// `bytes` read as UTF-8, each byte that is not part of a valid sequence as `\xNN`, and escaped as ``escaped(_:)``.
    public static func escaped(bytes: some Collection<UInt8>) -> String {
        let bytes = Array(bytes)
        var out = ""
        var index = 0
        while index < bytes.count {
            if let (scalar, length) = Self.scalar(in: bytes, at: index) {
                Self.append(scalar, to: &out)
                index += length
            } else {
                out += "\\x" + Self.hex(bytes[index])
                index += 1
            }
        }
        return out
    }

    /// The scalar whose well-formed UTF-8 sequence starts at `index`, and its length; nil when none does there.
    private static func scalar(in bytes: [UInt8], at index: Int) -> (Unicode.Scalar, Int)? {
        let lead = bytes[index]
        let (length, initial, lowest): (Int, UInt32, UInt32) =
            switch lead {
            case 0x00...0x7F: (1, UInt32(lead), 0)
            case 0xC2...0xDF: (2, UInt32(lead & 0x1F), 0x80)
            case 0xE0...0xEF: (3, UInt32(lead & 0x0F), 0x800)
            case 0xF0...0xF4: (4, UInt32(lead & 0x07), 0x10000)
            default: (0, 0, 0)
            }
        guard length > 0, index + length <= bytes.count else { return nil }
        var value = initial
        for byte in bytes[(index + 1)..<(index + length)] {
            guard byte & 0xC0 == 0x80 else { return nil }
            value = value << 6 | UInt32(byte & 0x3F)
        }
        guard value >= lowest, let scalar = Unicode.Scalar(value) else { return nil }
        return (scalar, length)
    }

    /// Whether `text` holds a character that ``escaped(_:)`` would escape (the backslash aside): a control, a C1
    /// control or a bidirectional control. A name that must be shown as given (an agent's name, say) is refused then.
    public static func hasControl(_ text: String) -> Bool {
        text.unicodeScalars.contains { $0 != "\\" && Self.needsEscape($0) }
    }

    static func needsEscape(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar.value {
        case 0x00...0x1F, 0x7F...0x9F, 0x5C: return true
        case 0x061C, 0x200E, 0x200F, 0x2028, 0x2029, 0x202A...0x202E, 0x2066...0x2069: return true
        default: return false
        }
    }

    private static func append(_ scalar: Unicode.Scalar, to out: inout String) {
        guard Self.needsEscape(scalar) else {
            out.unicodeScalars.append(scalar)
            return
        }
        switch scalar {
        case "\n": out += "\\n"
        case "\r": out += "\\r"
        case "\t": out += "\\t"
        case "\\": out += "\\\\"
        default:
            let digits = String(scalar.value, radix: 16)
            out += "\\u" + String(repeating: "0", count: max(0, 4 - digits.count)) + digits
        }
    }

    private static func hex(_ byte: UInt8) -> String {
        (byte < 16 ? "0" : "") + String(byte, radix: 16)
    }
}
