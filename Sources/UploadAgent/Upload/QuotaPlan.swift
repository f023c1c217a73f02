import UploadProtocol

/// What a relay said a selection would add to the account's quota use (SPEC §7.2), and which items of the selection
/// fit in what is left.
public struct QuotaPlan: Hashable, Sendable {
    /// What to ask: each blob's key and size, and whether the uploads would replace what their keys hold.
    public struct Request: Hashable, Sendable {
        public var entries: [Frame.Plan.Entry]
        public var overwrite: Bool

        public init(entries: [(key: String, size: UInt64)], overwrite: Bool) {
            self.entries = entries.map { Frame.Plan.Entry(key: $0.key, size: $0.size) }
            self.overwrite = overwrite
        }
    }

    /// The account the relay knows the token by.
    public var account: String
    /// The account's quota in bytes; nil: none.
    public var quota: UInt64?
    /// What counts against it now.
    public var used: UInt64
    /// Per entry of the request, in order: what uploading it would add to ``used``; its size (an upper bound) when the
    /// relay's first answer showed that the whole selection fits even if every byte counted.
    public var needs: [UInt64]

    public init(account: String = "", quota: UInt64?, used: UInt64, needs: [UInt64]) {
        self.account = account
        self.quota = quota
        self.used = used
        self.needs = needs
    }

    /// Bytes left under the quota; nil: no quota.
    public var left: UInt64? { self.quota.map { $0 > self.used ? $0 - self.used : 0 } }

    /// The sum of the needs (saturating).
    public var needed: UInt64 {
        self.needs.reduce(0) { $0.addingReportingOverflow($1).overflow ? .max : $0 + $1 }
    }

    /// Whether the whole selection fits.
    public var fits: Bool { self.left.map { self.needed <= $0 } ?? true }

    /// The entries that do not fit, taking the entries in order while what they need fits in what is left and passing
    /// over one that does not (a smaller one after it may fit). Empty when the whole selection fits.
    public var overflow: Set<Int> {
        guard var room = self.left, !self.fits else { return [] }
        var refused: Set<Int> = []
        for (index, need) in self.needs.enumerated() {
            if need <= room {
                room -= need
            } else {
                refused.insert(index)
            }
        }
        return refused
    }
}
