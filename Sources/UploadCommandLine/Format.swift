/// Numbers as the terminal lines show them, without Foundation's `String(format:)` (the agent links
/// FoundationEssentials only, so that ICU's 34 MB of data stays out of a binary meant for devices).
public enum Format {
    /// `value` with `digits` decimals, rounded half away from zero, as `%.Nf` prints a finite value.
    /// A byte count for people: `812 B`, `3.4 MiB`, `1.2 TiB` (powers of 1024, one decimal).
    public static func bytes(_ count: Int64) -> String {
        let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]
        var value = Double(count)
        var unit = 0
        while abs(value) >= 1024 && unit < units.count - 1 {
            value /= 1024
            unit += 1
        }
        return unit == 0 ? "\(count) B" : "\(Self.fixed(value)) \(units[unit])"
    }

    public static func fixed(_ value: Double, _ digits: Int = 1) -> String {
        guard value.isFinite, abs(value) < 1e15 else { return "\(value)" }
        var scale: Double = 1
        for _ in 0..<digits { scale *= 10 }
        let scaled = Int64((abs(value) * scale).rounded(.toNearestOrAwayFromZero))
        let divisor = Int64(scale)
        let whole = scaled / divisor
        let sign = value < 0 && scaled != 0 ? "-" : ""
        guard digits > 0 else { return "\(sign)\(whole)" }
        let fraction = String(scaled % divisor)
        return "\(sign)\(whole)." + String(repeating: "0", count: digits - fraction.count) + fraction
    }

    /// `value` as at least two digits (`%02d`).
    public static func twoDigits(_ value: Int) -> String {
        value >= 0 && value < 10 ? "0\(value)" : "\(value)"
    }

    /// `text` padded with spaces to `width` characters (longer text as it is).
    public static func padded(_ text: String, to width: Int) -> String {
        text.count >= width ? text : text + String(repeating: " ", count: width - text.count)
    }

    /// A duration in seconds as M:SS, or H:MM:SS from an hour.
    public static func clock(_ seconds: Int) -> String {
        seconds >= 3600
            ? "\(seconds / 3600):\(Self.twoDigits(seconds / 60 % 60)):\(Self.twoDigits(seconds % 60))"
            : "\(seconds / 60):\(Self.twoDigits(seconds % 60))"
    }
}
