import Foundation
import NIOConcurrencyHelpers
import Testing
import UploadProtocol
import UploadTestSupport

@testable import UploadRelay
@testable import UploadRelayPostgres
@testable import UploadRelaySQLite

/// Quota reservations across relays (issue 10): with one PostgreSQL catalog behind several relays, what an upload open on
/// one relay announced counts on every other relay while it is open, so two relays never both admit what only one
/// fits; and it stops counting when its relay lets the key go or dies (its lock connection drops), never by a timeout.
/// Against the run's real PostgreSQL.
@Suite("Quota across relays (PostgreSQL)")
struct QuotaAcrossRelaysTests {
    /// One relay's OPENs of one account's keys, as its sessions ask them: the key claimed, then the policy's answer; an
    /// admitted upload keeps its claim (and staging) until ``letGo(_:)`` or ``close()``.
    final class Opener: @unchecked Sendable {
        let relay: Relay
        let account: Account
        private let stagings = NIOLockedValueBox<[String: any StagingFile]>([:])

        init(_ relay: Relay, _ account: Account) {
            self.relay = relay
            self.account = account
        }

        func open(_ key: String, size: UInt64) async throws -> UploadPolicy.OpenDecision {
            let key = try ObjectKey(validating: key)
            let name = KeyClaims.name(account: self.account.name, key: key.value)
            guard self.relay.claims.claim(name, whenFree: {}) == .claimed else {
                throw TestSetupError(description: "\(key) is claimed already")
            }
            let answer = await self.relay.policy.open(
                account: self.account, open: Frame.Open(streamID: 1, key: key.value, size: size), key: key
            )
            if case .upload(_, let staging, _, _, _, _) = answer {
                self.stagings.withLockedValue { $0[key.value] = staging }
            } else {
                self.relay.claims.release(name)
            }
            return answer
        }

        /// The upload of `key` ends without a commit (cancelled, or its agent went): its key is let go.
        func letGo(_ key: String) {
            self.stagings.withLockedValue { $0.removeValue(forKey: key) }?.close()
            self.relay.claims.release(KeyClaims.name(account: self.account.name, key: key))
        }

        func close() {
            for key in self.stagings.withLockedValue({ Array($0.keys) }) { self.letGo(key) }
        }

        /// What is left of the quota for a new key, as this relay sees it.
        func left() async throws -> Int64 {
            try await self.relay.catalog.quotaUse(
                account: self.account.name, excludingKey: "no/such/key", active: self.relay.claims.activeUploads(of: self.account.name)
            ).left
        }
    }

    static func isUpload(_ decision: UploadPolicy.OpenDecision) -> Bool {
        if case .upload = decision { return true }
        return false
    }

    /// Two relays on one new database, the account `cam-7` with `quota`.
    static func withTwoRelays(quota: Int64, _ body: (Opener, Opener, PostgresCatalog) async throws -> Void) async throws {
        try await KeyLockTests.withTwoCatalogs { first, second in
            try await first.addAccount(name: "cam-7", tokenHash: Tokens.hash(Array("t".utf8)), quota: quota)
            let account = try await #require(try first.account(named: "cam-7"))
            let a = Opener(try KeyLockTests.relay(first), account)
            defer { a.close() }
            let b = Opener(try KeyLockTests.relay(second), account)
            defer { b.close() }
            try await body(a, b, first)
        }
    }

    @Test("an upload open on relay A holds what it announced on relay B, until A lets its key go or A's connection dies")
    func reservations() async throws {
        try await Self.withTwoRelays(quota: 10_000_000) { a, b, catalog in
            #expect(Self.isUpload(try await a.open("clips/big.mov", size: 8_000_000)))
            // Nothing of it is durable yet, and relay B holds no session of it: only the reservation tells B.
            let refused = try await b.open("photos/1.jpg", size: 5_000_000)
            guard case .refuse(.quotaExceeded, let message) = refused else {
                Issue.record("relay B admitted 5 MB beside relay A's open 8 MB in a 10 MB quota: \(refused)")
                return
            }
            #expect(message.contains("8000000 held by unfinished uploads"), "\(message)")
            #expect(Self.isUpload(try await b.open("photos/2.jpg", size: 2_000_000)), "2 MB fits beside the 8 MB")
            let (leftOnA, leftOnB) = (try await a.left(), try await b.left())
            #expect(leftOnA == 0 && leftOnB == 0)

            // Relay A's upload is cancelled: its key let go, its reservation goes with it.
            a.letGo("clips/big.mov")
            #expect(await Polling.waitUntil(timeout: 10) { (try? await b.left()) == 8_000_000 }, "relay B still counts A's cancelled upload")
            #expect(Self.isUpload(try await b.open("photos/1.jpg", size: 5_000_000)))

            // Relay A's connection to the database dies (as when the relay is killed) while it holds an upload open.
            #expect(Self.isUpload(try await a.open("clips/small.mov", size: 3_000_000)))
            guard case .refuse(.quotaExceeded, _) = try await b.open("photos/3.jpg", size: 1_000_000) else {
                Issue.record("relay B admitted 1 MB into a full quota")
                return
            }
            let lock = PostgresKeyLocks.lockID(account: "cam-7", key: "clips/small.mov")
            try await catalog.execute(
                "SELECT pg_terminate_backend(holder_pid) FROM key_claim WHERE lock_id = \(lock)"
            )
            #expect(await Polling.waitUntil(timeout: 10) { (try? await b.left()) == 3_000_000 }, "relay B still counts a dead relay's upload")
            #expect(Self.isUpload(try await b.open("photos/3.jpg", size: 1_000_000)))
            // Relay A stops the upload whose lock it lost; what B holds open still counts on A.
            a.letGo("clips/small.mov")
            #expect(try await a.left() == 2_000_000)
        }
    }

    static let raceQuota: Int64 = 40_000_000

    /// One OPEN of the race, its outcome noted.
    static func raceOpen(
        _ opener: Opener, thread: Int, index: Int, size: UInt64, outcomes: NIOLockedValueBox<[(size: UInt64, admitted: Bool)]>,
        failures: NIOLockedValueBox<[String]>
    ) async {
        do {
            let answer = try await opener.open("thread\(thread)/\(index).mov", size: size)
            switch answer {
            case .upload: outcomes.withLockedValue { $0.append((size, true)) }
            case .refuse(.quotaExceeded, _): outcomes.withLockedValue { $0.append((size, false)) }
            default: failures.withLockedValue { $0.append("thread \(thread), OPEN \(index): \(answer)") }
            }
        } catch {
            failures.withLockedValue { $0.append("thread \(thread), OPEN \(index): \(error)") }
        }
    }

    /// Two tasks making 20 OPENs each of 1 to 4 MB at once, about twice ``raceQuota`` together, through `openers`
    /// (two relays, or one relay twice): never more admitted than the quota, nothing refused that fitted, and every
    /// opener agrees on what is left.
    static func race(_ openers: [Opener], name: String) async throws {
        let seed = ProcessInfo.processInfo.environment["QUOTA_RACE_SEED"].flatMap(UInt64.init) ?? UInt64.random(in: 1...1_000_000)
        print("quota race (\(name)) seed \(seed) (QUOTA_RACE_SEED=\(seed) replays its sizes)")
        var generator = SeededGenerator(seed: seed)
        let quota = Self.raceQuota
        let sizes = (0..<2).map { _ in (0..<20).map { _ in UInt64.random(in: 1_000_000...4_000_000, using: &generator) } }
        let outcomes = NIOLockedValueBox<[(size: UInt64, admitted: Bool)]>([])
        let failures = NIOLockedValueBox<[String]>([])
        await withTaskGroup(of: Void.self) { group in
            for thread in 0..<2 {
                group.addTask {
                    for (index, size) in sizes[thread].enumerated() {
                        await Self.raceOpen(openers[thread], thread: thread, index: index, size: size, outcomes: outcomes, failures: failures)
                    }
                }
            }
        }
        #expect(failures.withLockedValue { $0 }.isEmpty, "\(failures.withLockedValue { $0 })")
        let all = outcomes.withLockedValue { $0 }
        let admitted = all.filter(\.admitted).reduce(Int64(0)) { $0 + Int64($1.size) }
        #expect(admitted <= quota, "\(name), seed \(seed): \(admitted) bytes admitted into a \(quota)-byte quota")
        // Admissions only take room here: a refusal means less than its size was left then, and so at the end.
        if let smallestRefused = all.filter({ !$0.admitted }).map(\.size).min() {
            #expect(
                quota - admitted < Int64(smallestRefused), "\(name), seed \(seed): \(smallestRefused) bytes refused, yet \(quota - admitted) left")
        } else {
            Issue.record("\(name), seed \(seed): nothing refused of about twice the quota")
        }
        for opener in openers {
            await #expect(try opener.left() == quota - admitted)
        }
    }

    @Test("two relays admitting at once never admit more than the quota, and refuse only what did not fit (seeded)")
    func race() async throws {
        try await Self.withTwoRelays(quota: Self.raceQuota) { a, b, _ in try await Self.race([a, b], name: "two relays") }
    }

    @Test("one relay's OPENs of one account at once, on either catalog, never admit more than the quota (seeded)")
    func oneRelayRace() async throws {
        let sqlite = try SQLiteCatalog(path: TemporaryDirectories.make(prefix: "upload-quota-race-") + "/catalog.sqlite")
        try await sqlite.addAccount(name: "cam-7", tokenHash: Tokens.hash(Array("t".utf8)), quota: Self.raceQuota)
        let onSQLite = await Opener(try KeyLockTests.relay(sqlite), try #require(try sqlite.account(named: "cam-7")))
        defer { onSQLite.close() }
        try await Self.race([onSQLite, onSQLite], name: "one relay, SQLite")
        try await Self.withTwoRelays(quota: Self.raceQuota) { a, _, _ in try await Self.race([a, a], name: "one relay, PostgreSQL") }
    }
}
