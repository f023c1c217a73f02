import Foundation
import NIOConcurrencyHelpers
import Testing
import UploadTestSupport

@testable import UploadRelay

/// The relay's claims on keys: what ``KeyClaims/activeUploads(of:)`` answers at each OPEN is kept as claims change, and
/// must always equal what a walk over every claim finds.
@Suite("Key claims")
struct KeyClaimsTests {
    /// What a claim is, in the walk's terms.
    struct Model {
        var claims: [String: (closing: Bool, announced: Int64)] = [:]

        /// The walk the index replaced: every claim of the account, not closing, with what it announced.
        func active(of account: String) -> [String: Int64] {
            var active: [String: Int64] = [:]
            for (name, claim) in self.claims where !claim.closing && name.hasPrefix(account + "\u{0}") {
                active[String(name.dropFirst(account.count + 1))] = claim.announced
            }
            return active
        }
    }

    @Test("open uploads of an account, by hand: closing, released and stripes do not count; accounts apart")
    func handPicked() {
        let claims = KeyClaims()
        let a = KeyClaims.name(account: "cam", key: "a.jpg")
        let b = KeyClaims.name(account: "cam", key: "dir/b.jpg")
        let other = KeyClaims.name(account: "cam-2", key: "a.jpg")
        #expect(claims.claim(a, whenFree: {}) == .claimed)
        #expect(claims.claim(b, whenFree: {}) == .claimed)
        #expect(claims.claim(other, whenFree: {}) == .claimed)
        #expect(claims.tryClaim(KeyClaims.stripeName(account: "cam", key: "big", index: 3)))
        claims.announce(a, size: 700)
        #expect(claims.activeUploads(of: "cam") == ["a.jpg": 700, "dir/b.jpg": 0])
        #expect(claims.activeUploads(of: "cam-2") == ["a.jpg": 0])
        #expect(claims.activeUploads(of: "ca") == [:])
        claims.markClosing(a)
        // A closing claim announcing (its session's last words) stays out.
        claims.announce(a, size: 900)
        #expect(claims.activeUploads(of: "cam") == ["dir/b.jpg": 0])
        #expect(claims.claim(a, whenFree: {}) == .queued)
        claims.release(a)
        claims.release(b)
        #expect(claims.activeUploads(of: "cam") == [:])
        #expect(claims.activeUploads(of: "cam-2") == ["a.jpg": 0])
        #expect(claims.count == 2)
    }

    @Test("seeded random claims, announcements, closings and releases: the kept answer equals the walk after each step")
    func seededAgainstTheWalk() {
        let base = ProcessInfo.processInfo.environment["SCENARIO_SEED"].flatMap(UInt64.init) ?? UInt64.random(in: 1...1_000_000)
        print("key claims seed \(base) (SCENARIO_SEED=\(base) replays it)")
        var rng = SeededGenerator(seed: base)
        let claims = KeyClaims()
        var model = Model()
        let accounts = ["cam", "cam-2", "c"]
        let keys = ["a", "b/c.jpg", "a\u{1}", "long/key/of/more/than/fifteen/bytes.mov", "é"]
        for step in 0..<4_000 {
            let account = accounts.randomElement(using: &rng)!
            let key = keys.randomElement(using: &rng)!
            let name =
                Int.random(in: 0..<10, using: &rng) == 0
                ? KeyClaims.stripeName(account: account, key: key, index: Int.random(in: 0..<3, using: &rng))
                : KeyClaims.name(account: account, key: key)
            switch Int.random(in: 0..<5, using: &rng) {
            case 0:
                if claims.claim(name, whenFree: {}) == .claimed { model.claims[name] = (false, 0) }
            case 1:
                if claims.tryClaim(name) { model.claims[name] = (false, 0) }
            case 2:
                let size = Int64.random(in: 0..<1_000, using: &rng)
                claims.announce(name, size: size)
                model.claims[name]?.announced = size
            case 3:
                claims.markClosing(name)
                model.claims[name]?.closing = true
            default:
                claims.release(name)
                model.claims[name] = nil
            }
            for account in accounts {
                #expect(claims.activeUploads(of: account) == model.active(of: account), "seed \(base), step \(step), account \(account)")
            }
            #expect(claims.count == model.claims.count, "seed \(base), step \(step)")
        }
    }
}
