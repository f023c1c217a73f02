import Foundation
import NIOConcurrencyHelpers
import Logging
import Testing
import UploadRelay
import UploadRelayPostgres
import UploadTestSupport

/// The connection that holds a relay's key locks across relays (issue 10), cut off without a reset: the relay must stop
/// the uploads whose keys it held before PostgreSQL lets those locks go to another relay.
@Suite("End to end: a silent lock connection (PostgreSQL)")
struct LockConnectionTests {
    @Test(
        "a lock connection that stops answering (its path to the database frozen, no reset) is closed within the heartbeat, and the relay told; a new one takes locks again"
    )
    func silentLockConnection() async throws {
        try await PostgresTestDatabase.with { url in
            var address = try #require(URLComponents(string: url))
            let directory = TestRelay.makeDirectory()
            // Every byte to the database passes a proxy that this test freezes (SIGSTOP): TCP stays up, nothing answers.
            let (proxy, port) = try await startProxy(target: try #require(address.port), directory: directory, [])
            defer {
                // SIGKILL: the child may inherit a mask that blocks SIGTERM from the test process's thread.
                proxy.kill(SIGKILL)
                _ = proxy.waitForExit()
            }
            address.port = port
            let heartbeat = LockHeartbeat(interval: .milliseconds(500), timeout: .seconds(3))
            let catalog = try await PostgresCatalog(
                url: try #require(address.string), logger: PostgresTestDatabase.quietLogger, lockHeartbeat: heartbeat
            )
            defer { catalog.shutdown() }
            let locks = try #require(catalog.keyLocks)
            let lost = NIOLockedValueBox(false)
            locks.whenLost { _ in lost.withLockedValue { $0 = true } }
            _ = try await #require(try locks.tryLock(account: "cam-7", key: "clips/1.mov"))
            // Answered heartbeats lose nothing: four of them go by.
            #expect(await !Polling.waitUntil(timeout: 2) { lost.withLockedValue { $0 } }, "a connection that answers was given up")

            proxy.kill(SIGSTOP)
            let frozen = Date()
            #expect(
                await Polling.waitUntil(timeout: 20) { lost.withLockedValue { $0 } }, "the relay was not told that its lock connection went silent")
            let noticed = Date().timeIntervalSince(frozen)
            #expect(noticed < 10, "noticed after \(noticed) s; the heartbeat allows 3.5 s")
            proxy.kill(SIGCONT)
            #expect(try await locks.tryLock(account: "cam-7", key: "clips/2.mov") != nil, "no new lock connection after the old one was given up")
        }
    }

    @Test("a heartbeat slower than PostgreSQL's keepalives is refused: the relay would not stop before its locks go")
    func heartbeatBound() async throws {
        let late = LockHeartbeat(interval: .seconds(30), timeout: .seconds(30), serverKeepalive: (idle: 10, interval: 2, count: 3))
        // Refused before any connection is tried (nothing listens on port 1).
        let error = await #expect(throws: CatalogError.self) {
            _ = try await PostgresCatalog(
                url: "postgres://u@127.0.0.1:1/none?sslmode=disable", logger: PostgresTestDatabase.quietLogger, lockHeartbeat: late)
        }
        #expect(error?.description.contains("heartbeat") == true, "\(String(describing: error))")
    }
}
