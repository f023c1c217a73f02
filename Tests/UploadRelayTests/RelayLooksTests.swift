import Foundation
import Testing

@testable import UploadRelay
import UploadRelayTesting

/// `token delete`, `revoke`, `disable` and `rotate` return once every running relay has told its connections: the
/// catalog's record of each relay's last look at the accounts (``RelayAdmin/waitForLooks(catalog:after:timeout:live:)``).
@Suite("Admin changes wait for the relays' looks")
struct RelayLooksTests {
    @Test("a running relay behind the change is waited for until it looks; one gone for long is not; one that never looks is counted silent")
    func waits() async throws {
        let catalog = InMemoryCatalog()
        let change = Date()
        try await catalog.recordLook(relay: "running", readAt: change.addingTimeInterval(-1))
        try await catalog.recordLook(relay: "gone", readAt: change.addingTimeInterval(-60))
        // Behind the change, the running relay is waited for (to the end of a short timeout here); the gone one is not.
        #expect(
            try await RelayAdmin.waitForLooks(catalog: catalog, after: change, timeout: .milliseconds(300)) == RelayAdmin.Looks(told: 0, silent: 1))
        // Its next look, after the change: the wait ends at once.
        try await catalog.recordLook(relay: "running", readAt: change.addingTimeInterval(0.5))
        let started = ContinuousClock.now
        #expect(try await RelayAdmin.waitForLooks(catalog: catalog, after: change, timeout: .seconds(30)) == RelayAdmin.Looks(told: 1, silent: 0))
        #expect(ContinuousClock.now - started < .seconds(10))
        // A look recorded late, from before, never replaces it.
        try await catalog.recordLook(relay: "running", readAt: change.addingTimeInterval(-1))
        #expect(try await catalog.relayLooks()["running"] == change.addingTimeInterval(0.5))

        try await catalog.recordLook(relay: "stuck", readAt: change.addingTimeInterval(-2))
        let stuckSince = ContinuousClock.now
        let silent = try await RelayAdmin.waitForLooks(catalog: catalog, after: change.addingTimeInterval(0.1), timeout: .milliseconds(300))
        #expect(silent == RelayAdmin.Looks(told: 1, silent: 1))
        #expect(ContinuousClock.now - stuckSince >= .milliseconds(300))
        #expect(try await RelayAdmin.waitForLooks(catalog: InMemoryCatalog(), after: change) == RelayAdmin.Looks(), "no relay: nothing to wait for")
    }
}
