import Foundation
import Logging
import NIOCore

/// The relay's housekeeping, every ``RelayConfiguration/maintenanceInterval`` while ``RelayServer/run()`` runs, as one
/// of its child tasks: connections whose principal is gone close (a token revoked or replaced, or an account deleted,
/// must not keep acting on a connection it opened before), commits a failure left pending are settled, and sessions
/// past their expiry go (they would hold quota and staging space for good), except those whose key an upload holds now.
struct RelayMaintenance: Sendable {
    let relay: Relay
    /// The connections open now.
    let connections: @Sendable () -> [any Channel]
    /// Where the connections' acknowledgements of a look are gathered.
    let eventLoop: any EventLoop
    /// This process's name in the catalog's record of looks (``Catalog/recordLook(relay:readAt:)``).
    let relayID = "\(ProcessInfo.processInfo.hostName)/\(getpid())/\(UInt32.random(in: 0...UInt32.max))"

    /// Looks until cancelled. A look under way when the task is cancelled ends first.
    func run() async {
        let (catalog, logger) = (self.relay.catalog, self.relay.logger)
        // A relay that has just started holds no connection of a principal gone before now: recorded at once, so that an
        // admin's wait counts it from its first moment.
        do {
            try await catalog.recordLook(relay: self.relayID, readAt: try await catalog.clock())
        } catch {
            logger.warning("could not record the relay's start in the catalog", metadata: ["error": "\(error)"])
        }
        let interval = self.relay.configuration.maintenanceInterval
        let expiryEvery = min(self.relay.configuration.sessionExpiry / 4, .seconds(600))
        // The accounts at the last look; nil before the first. Only changes are logged, but every look goes to every
        // connection: a connection compares its own principal, so no change between two looks can be missed (an
        // account deleted at one look and made again before the next is still another principal).
        var known: [String: Account]? = nil
        var lastExpiry = ContinuousClock.now
        while (try? await Task.sleep(for: interval)) != nil {
            let expire = ContinuousClock.now - lastExpiry >= expiryEvery
            if expire { lastExpiry = .now }
            do {
                try await self.look(expire: expire, known: &known)
            } catch {
                logger.warning("relay maintenance failed", metadata: ["error": "\(error)"])
            }
        }
    }

    /// One look: housekeeping, then the accounts, told to every connection, then the look recorded.
    private func look(expire: Bool, known: inout [String: Account]?) async throws {
        let relay = self.relay
        let keys = RelayRuntime.KeyGuard.claiming(relay.claims)
        // Housekeeping that fails is said, and the look at the accounts goes on all the same.
        do {
            // Commits a failure left pending are settled under their key (they held quota until a restart).
            try await RelayRuntime.recover(catalog: relay.catalog, store: relay.store, logger: relay.logger, keys: keys, objects: false)
            if expire {
                let expiry = relay.configuration.sessionExpiry
                try await RelayRuntime.cleanUp(
                    catalog: relay.catalog, store: relay.store, expiry: expiry, logger: relay.logger, keys: keys,
                    orphansBefore: Date().addingTimeInterval(-Double(expiry.components.seconds))
                )
            }
        } catch {
            relay.logger.warning("relay housekeeping failed", metadata: ["error": "\(error)"])
        }
        // Read last, so that a connection authenticated while housekeeping ran is judged by a look no older.
        let readAt = try await relay.catalog.clock()
        let accounts = Dictionary(try await relay.catalog.accounts().map { ($0.name, $0) }, uniquingKeysWith: { first, _ in first })
        if let before = known {
            for (name, was) in before.sorted(by: { $0.key < $1.key }) where !was.revoked {
                let change: String? =
                    switch accounts[name] {
                    case nil: "account deleted"
                    case let now? where now.revoked: "token revoked"
                    case let now? where now.tokenHash != was.tokenHash: "token replaced"
                    default: nil
                    }
                if let change {
                    relay.logger.notice("\(change): closing the connections made with its token", metadata: ["account": "\(name)"])
                }
            }
        }
        known = accounts
        let event = RelayAccountsEvent(accounts: accounts)
        let told = self.connections().map { connection in
            connection.eventLoop.submit { connection.pipeline.fireUserInboundEventTriggered(event) }
        }
        // Once every connection has taken it in: `token delete` and `revoke` wait for this record
        // (RelayAdmin.waitForLooks).
        try await EventLoopFuture.andAllComplete(told, on: self.eventLoop).get()
        try await relay.catalog.recordLook(relay: self.relayID, readAt: readAt)
    }
}
