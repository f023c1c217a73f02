import NIOConcurrencyHelpers

/// The stagings one store opened that are still alive: its commit takes only those (never a staging of another store,
/// even one of the same kind) and gets each back as its own type. Holds them weakly; a staging leaves it when it is
/// freed (its `deinit` calls ``forget(_:)``).
public struct StagingRegistry<File: StagingFile>: Sendable {
    private struct Entry: Sendable {
        weak var file: File?
    }

    private let entries = NIOLockedValueBox<[ObjectIdentifier: Entry]>([:])

    public init() {}

    /// Records a staging the store has just opened, and returns it.
    public func registered(_ file: File) -> File {
        self.entries.withLockedValue { $0[ObjectIdentifier(file)] = Entry(file: file) }
        return file
    }

    /// Forgets the staging with this identity (from its `deinit`).
    public func forget(_ identity: ObjectIdentifier) {
        self.entries.withLockedValue { _ = $0.removeValue(forKey: identity) }
    }

    /// The store's own staging that `staging` is, or nil when this store did not open it.
    public func own(_ staging: any StagingFile) -> File? {
        self.entries.withLockedValue { $0[ObjectIdentifier(staging)]?.file }
    }
}
