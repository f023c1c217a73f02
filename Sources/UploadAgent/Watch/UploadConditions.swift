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
    /// Only while the default route goes through a wireless interface (`--only-on-wifi`): the seeds' "Wi-Fi only".
    public var onlyOnWiFi = false
    /// Only while NetworkManager, where it runs, does not call the default route's connection metered (`--not-metered`).
    public var notMetered = false
    /// The kernel's IPv4 routing table (a fake file in tests).
    public var routeTable = "/proc/net/route"
    /// Where Linux lists network interfaces; a wireless one has `wireless` or `phy80211` in its directory.
    public var networkDirectory = "/sys/class/net"
    /// The program asked whether a device's connection is metered, as `PROGRAM -t -g GENERAL.METERED device show IFACE`
    /// (NetworkManager's nmcli; a fake one in tests). Absent or failing: not metered.
    public var meteredProgram = "nmcli"

    public init() {}

    public var isEmpty: Bool {
        !self.onlyOnAC && self.minBattery == nil && self.command == nil && !self.onlyOnWiFi && !self.notMetered
    }

    private func read(_ supply: String, _ name: String) -> String? {
        (try? String(contentsOfFile: self.powerSupplyDirectory + "/" + supply + "/" + name, encoding: .utf8))?.trimmed
    }

    /// Why uploads must wait now, or nil when they may run. Blocking: `--when` runs its command.
    public func blocker() -> String? {
        if self.onlyOnAC || self.minBattery != nil, let blocker = self.powerBlocker() {
            return blocker
        }
        if self.onlyOnWiFi || self.notMetered, let blocker = self.networkBlocker() {
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

    /// The interface of the default IPv4 route (the lowest metric), or nil when there is none.
    func defaultRouteInterface() -> String? {
        guard let table = try? String(contentsOfFile: self.routeTable, encoding: .utf8) else { return nil }
        var best: (interface: String, metric: Int)? = nil
        // Iface Destination Gateway Flags RefCnt Use Metric Mask ...; a default route has destination and mask 0.
        for line in table.split(separator: "\n").dropFirst() {
            let fields = line.split(whereSeparator: { $0 == "\t" || $0 == " " })
            guard fields.count >= 8, fields[1] == "00000000", fields[7] == "00000000",
                let flags = Int(fields[3], radix: 16), flags & 0x1 != 0, let metric = Int(fields[6])
            else { continue }
            if best.map({ metric < $0.metric }) ?? true { best = (String(fields[0]), metric) }
        }
        return best?.interface
    }

    /// Whether `interface` is a wireless one (Wi-Fi), by its sysfs directory.
    func isWireless(_ interface: String) -> Bool {
        let directory = self.networkDirectory + "/" + interface
        return Platform.exists(directory + "/wireless") || Platform.exists(directory + "/phy80211")
    }

    /// What the network forbids: no default route, one that is not Wi-Fi, or a metered connection.
    private func networkBlocker() -> String? {
        guard let interface = self.defaultRouteInterface() else {
            return self.onlyOnWiFi ? "waiting for Wi-Fi (--only-on-wifi): no default route" : nil
        }
        if self.onlyOnWiFi, !self.isWireless(interface) {
            return "waiting for Wi-Fi (--only-on-wifi): the default route goes through \(interface), which is not wireless"
        }
        if self.notMetered, self.isMetered(interface) {
            return "waiting for an unmetered connection (--not-metered): NetworkManager calls \(interface)'s metered"
        }
        return nil
    }

    /// Whether NetworkManager calls `interface`'s connection metered ("yes", or "yes (guessed)").
    func isMetered(_ interface: String) -> Bool {
        guard interface.allSatisfy({ $0.isLetter || $0.isNumber || "-_.:@".contains($0) }) else { return false }
        let command = "\(Self.quoted(self.meteredProgram)) -t -g GENERAL.METERED device show \(interface) 2>/dev/null | grep -q '^yes'"
        return (try? Platform.runShell(command)) == 0
    }

    private static func quoted(_ text: String) -> String {
        "'" + text.replacing("'", with: "'\\''") + "'"
    }
}
