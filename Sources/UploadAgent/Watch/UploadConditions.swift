import FoundationEssentials

/// When uploads may run on a device: on mains power, above a battery level, while a command says yes (an unmetered
/// network, a quiet hour). Checked every `interval` by a running agent; a condition that turns false holds the queue
/// (uploads stop, the relay keeps what it acknowledged) until it turns true again.
public struct UploadConditions: Sendable {
    /// Only while a mains or USB supply is online (`--only-on-ac`). A machine without any is always on mains.
    public var onlyOnAC = false
    /// Only while the battery is at least this many percent (`--min-battery`), or on mains power.
    public var minBattery: Int? = nil
    /// A shell command: uploads run while it exits 0 (`--when`).
    public var command: String? = nil
    /// Where Linux lists power supplies (a fake directory in tests).
    public var powerSupplyDirectory = "/sys/class/power_supply"

    public init() {}

    public var isEmpty: Bool { !self.onlyOnAC && self.minBattery == nil && self.command == nil }

    private func read(_ supply: String, _ name: String) -> String? {
        (try? String(contentsOfFile: self.powerSupplyDirectory + "/" + supply + "/" + name, encoding: .utf8))?.trimmed
    }

    /// Why uploads must wait now, or nil when they may run. Blocking: `--when` runs its command.
    public func blocker() -> String? {
        if self.onlyOnAC || self.minBattery != nil, let blocker = self.powerBlocker() {
            return blocker
        }
        guard let command = self.command else { return nil }
        let status: Int32
        do {
            status = try Platform.runShell(command)
        } catch {
            return "--when \(command) could not run: \(error)"
        }
        return status == 0 ? nil : "--when \(command) exited \(status)"
    }

    /// What the power supplies forbid: running off mains power, or a battery below the minimum.
    private func powerBlocker() -> String? {
        let supplies = (try? FileManager.default.contentsOfDirectory(atPath: self.powerSupplyDirectory)) ?? []
        let mains = supplies.filter { ["Mains", "USB"].contains(self.read($0, "type") ?? "") }
        guard !mains.isEmpty, !mains.contains(where: { self.read($0, "online") == "1" }) else { return nil }
        if self.onlyOnAC {
            return "waiting for mains power (--only-on-ac)"
        }
        let levels = supplies.filter { self.read($0, "type") == "Battery" }.compactMap { self.read($0, "capacity").flatMap(Int.init) }
        if let minimum = self.minBattery, let level = levels.min(), level < minimum {
            return "battery at \(level)%, below --min-battery \(minimum)"
        }
        return nil
    }
}
