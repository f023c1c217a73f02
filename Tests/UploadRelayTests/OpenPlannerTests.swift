import Foundation
import Testing
import UploadChecksums
import UploadProtocol

@testable import UploadRelay

/// OPEN's planner by tables (SPEC §6.2, §7, §7.1): facts in, a plan out, no catalog and no store.
@Suite("OPEN planner")
struct OpenPlannerTests {
    static let key = try! ObjectKey(validating: "cam-7/clip.mp4")
    static let digest = SHA1Digest(hex: "a9993e364706816aba3e25717850c26c9cd0d89d")!
    static let other = SHA1Digest(hex: "da39a3ee5e6b4b0d3255bfef95601890afd80709")!
    static let date = Date(timeIntervalSince1970: 1_800_000_000)

    static func object(_ key: String = "cam-7/clip.mp4", size: Int64 = 1000, sha1: SHA1Digest = Self.digest) -> StoredObject {
        StoredObject(
            account: "cam-7", key: key, size: size, sha1: sha1.hex, identity: ObjectIdentity(device: 1, inode: 2, size: size, modified: 3),
            committedAt: Self.date
        )
    }

    static func session(size: Int64? = 1000, token: [UInt8] = [7], fingerprint: [UInt8] = [1], striped: Bool = false) -> UploadSession {
        UploadSession(
            id: "s", account: "cam-7", key: Self.key.value, resumeToken: token, fingerprint: fingerprint, declaredSize: size, durableOffset: 500,
            sha1State: [], stagingName: "s", striped: striped, updatedAt: Self.date
        )
    }

    static func open(
        size: UInt64? = 1000, sha1: SHA1Digest? = nil, probe: SHA1Digest? = nil, overwrite: Bool = false, fingerprint: [UInt8] = [1],
        token: [UInt8] = [], striped: Bool = false
    ) -> Frame.Open {
        Frame.Open(
            streamID: 1, key: Self.key.value, size: size, sha1: sha1, overwrite: overwrite, fingerprint: fingerprint, resumeToken: token,
            probe: probe, striped: striped
        )
    }

    static func facts(_ change: (inout OpenFacts) -> Void = { _ in }) -> OpenFacts {
        var facts = OpenFacts(maxBlobSize: 1 << 40, syncBytes: 4096)
        change(&facts)
        return facts
    }

    static func upload(
        growth: Int64 = 1000, replacing: Int64 = 0, resume: UploadSession? = nil, discard: UploadSession? = nil,
        record: OpenUpload.Record = .atFirstSync
    ) -> OpenPlan {
        .upload(OpenUpload(growth: growth, replacing: replacing, resume: resume, discard: discard, record: record))
    }

    struct Case: CustomTestStringConvertible, Sendable {
        var name: String
        var open: Frame.Open
        var facts: OpenFacts
        var plan: OpenPlan
        var testDescription: String { self.name }
    }

    static let alreadyExists = OpenPlan.refuse(.alreadyExists, UploadPolicy.alreadyExists(Self.key))

    static let cases: [Case] = [
        Case(
            name: "larger than the relay's largest blob: TOO_LARGE, before anything else", open: open(size: 2 << 40, sha1: digest),
            facts: facts {
                $0.conflict = "x"; $0.existing = object(); $0.existingVerified = true
            },
            plan: .refuse(.tooLarge, "\(2 << 40) bytes is larger than this relay's limit of \(1 << 40)")
        ),
        Case(
            name: "a key the store cannot hold: INVALID_KEY", open: open(), facts: facts { $0.conflict = "a file is in the way" },
            plan: .refuse(.invalidKey, "a file is in the way")),
        Case(
            name: "SHA-1 known, the key holds these verified bytes: STORED", open: open(sha1: digest),
            facts: facts {
                $0.existing = object(); $0.existingVerified = true; $0.twins = [object("other")]
            }, plan: .stored(size: 1000)
        ),
        Case(
            name: "SHA-1 known, the key's file changed since its commit: never vouched for, ALREADY_EXISTS without OVERWRITE",
            open: open(sha1: digest), facts: facts { $0.existing = object() }, plan: alreadyExists
        ),
        Case(
            name: "SHA-1 known, other content under the key: ALREADY_EXISTS", open: open(sha1: digest),
            facts: facts { $0.existing = object(sha1: other) }, plan: alreadyExists),
        Case(
            name: "SHA-1 known, other content, OVERWRITE, a verified twin: a copy linked", open: open(sha1: digest, overwrite: true),
            facts: facts {
                $0.existing = object(size: 10, sha1: other); $0.twins = [object("b"), object("c")]
            }, plan: .duplicate([object("b"), object("c")])
        ),
        Case(
            name: "SHA-1 known, OVERWRITE of a larger object, no twin: an upload that shrinks the account", open: open(sha1: digest, overwrite: true),
            facts: facts { $0.existing = object(size: 3000, sha1: other) }, plan: upload(growth: -2000, replacing: 3000)
        ),
        Case(
            name: "SHA-1 known, a new key, no twin: an upload, recorded at its first sync", open: open(sha1: digest), facts: facts(), plan: upload()),
        Case(
            name: "PROBE that matched: CONFIRM", open: open(size: 300_000, probe: digest),
            facts: facts {
                $0.probeMatched = true; $0.existing = object()
            }, plan: .confirm),
        Case(
            name: "PROBE unmatched, the key holds an object: ALREADY_EXISTS at OPEN", open: open(size: 300_000, probe: digest),
            facts: facts { $0.existing = object() }, plan: alreadyExists),
        Case(
            name: "PROBE unmatched, a new key: an upload longer than a sync, recorded at OPEN", open: open(size: 300_000, probe: digest),
            facts: facts(),
            plan: upload(growth: 300_000, record: .atOpen)
        ),
        Case(
            name: "no SHA-1, the key holds an object: decided at commit, an upload replacing it", open: open(size: 100),
            facts: facts { $0.existing = object() }, plan: upload(growth: -900, replacing: 1000)),
        Case(
            name: "a stream of unknown size: recorded at OPEN, growth 0", open: open(size: nil), facts: facts(),
            plan: upload(growth: 0, record: .atOpen)),
        Case(
            name: "striped: recorded at OPEN for its PART streams", open: open(size: 1000, striped: true), facts: facts(),
            plan: upload(record: .striped)),
        Case(
            name: "the session named by its token, its SHA-1 state usable: resumed", open: open(token: [7]),
            facts: facts {
                $0.session = session(); $0.sessionHashUsable = true
            }, plan: upload(resume: session())
        ),
        Case(
            name: "the session named by its fingerprint: resumed", open: open(fingerprint: [1]),
            facts: facts {
                $0.session = session(token: [9]); $0.sessionHashUsable = true
            }, plan: upload(resume: session(token: [9]))
        ),
        Case(
            name: "the session's SHA-1 state does not cover its bytes: dropped, started over", open: open(token: [7]),
            facts: facts { $0.session = session() }, plan: upload(discard: session())
        ),
        Case(
            name: "another version of the source (fingerprint): dropped, started over", open: open(fingerprint: [2], token: [7]),
            facts: facts {
                $0.session = session(); $0.sessionHashUsable = true
            }, plan: upload(discard: session())
        ),
        Case(
            name: "another size: dropped, started over", open: open(size: 999, token: [7]),
            facts: facts {
                $0.session = session(); $0.sessionHashUsable = true
            }, plan: upload(growth: 999, discard: session())
        ),
        Case(
            name: "striped differently: dropped, started over", open: open(token: [7], striped: true),
            facts: facts {
                $0.session = session(); $0.sessionHashUsable = true
            }, plan: upload(discard: session(), record: .striped)
        ),
        Case(
            name: "neither token nor fingerprint names it: dropped, started over", open: open(fingerprint: [], token: []),
            facts: facts {
                $0.session = session(); $0.sessionHashUsable = true
            }, plan: upload(discard: session())
        ),
    ]

    @Test("facts to plan", arguments: Self.cases)
    func table(_ row: Case) async {
        #expect(OpenPlanner.plan(row.open, key: Self.key, row.facts) == row.plan, "\(row.name)")
    }
}
