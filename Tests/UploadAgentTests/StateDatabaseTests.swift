import GRDB
import Testing
import UploadCommandLine
import UploadTestSupport

@testable import UploadAgent

@Suite("The agent's state database on SQLite's C API, and the numbers its commands print")
struct StateDatabaseTests {
    @Test("a state database GRDB made (schema v1, its migrations table) opens as it is: its items are read, v2 is applied, v1 is not run again")
    func opensWhatGRDBMade() async throws {
        let directory = TemporaryDirectories.make()
        // As the agent before 1.0 left it: GRDB's migrator applied "v1", and one item was queued.
        do {
            let queue = try DatabaseQueue(path: directory + "/state.sqlite")
            var migrator = DatabaseMigrator()
            migrator.registerMigration("v1") { db in try db.execute(sql: AgentStateStore.migrations[0].sql) }
            try migrator.migrate(queue)
            try await queue.write { db in
                try db.execute(
                    sql: """
                        INSERT INTO item (target, key, path, status, size, fingerprint, acked, added_at, updated_at)
                        VALUES ('relay:7443#ab', 'DCIM/a.jpg', '/photos/a.jpg', 'queued', 10, x'0102', 4, 1, 1),
                               ('relay:7443#ab', 'DCIM/b.jpg', 'DCIM/b.jpg', 'queued', 20, x'03', 0, 2, 2)
                        """
                )
            }
        }
        let store = try AgentStateStore(directory: directory)
        let items = try store.items()
        #expect(items.map(\.key) == ["DCIM/a.jpg", "DCIM/b.jpg"])
        #expect(items.first?.fingerprint == [1, 2] && items.first?.acked == 4 && items.first?.size == 10)
        #expect(items.first?.followSymlinks == false)
        // v2 failed the item queued with a relative path, and recorded itself once.
        #expect(items.last?.status == .failed && items.last?.error?.contains("relative path") == true)
        let applied = try await DatabaseQueue(path: directory + "/state.sqlite").read { db in
            try String.fetchAll(db, sql: "SELECT identifier FROM grdb_migrations ORDER BY identifier")
        }
        #expect(applied == ["v1", "v2: absolute paths, symbolic links"])
        // Opened again: nothing runs twice (v1's CREATE TABLE would fail).
        _ = try AgentStateStore(directory: directory)
    }

    @Test("values round-trip: blobs (empty ones too, never NULL), integers past 2^53, doubles, NULL, text with NUL-free UTF-8")
    func valuesRoundTrip() async throws {
        let directory = TemporaryDirectories.make()
        let database = try StateDatabase(path: directory + "/t.sqlite", busyTimeoutMillis: 1000)
        try database.inTransaction { db in
            try db.script("CREATE TABLE t (b BLOB, i INTEGER, d DOUBLE, s TEXT, n TEXT)")
            try db.execute("INSERT INTO t VALUES (?, ?, ?, ?, ?)", [[UInt8](), Int64(1 << 60) + 1, 0.25, "Ünïcødé 📷", String?.none])
            try db.execute("INSERT INTO t VALUES (?, ?, ?, ?, ?)", [[UInt8](repeating: 0, count: 3), Int64(-1), -1.5, "", "x"])
        }
        let rows = try database.withConnection { db in try db.rows("SELECT *, b IS NULL AS b_null FROM t ORDER BY rowid") }
        #expect(rows.count == 2)
        #expect(rows[0].bytes("b") == [] && rows[0].int64("b_null") == 0)
        #expect(rows[0].int64("i") == Int64(1 << 60) + 1 && rows[0].double("d") == 0.25)
        #expect(rows[0].string("s") == "Ünïcødé 📷" && rows[0].string("n") == nil)
        #expect(rows[1].bytes("b") == [0, 0, 0] && rows[1].int64("i") == -1 && rows[1].string("n") == "x")
        // A failing statement rolls its transaction back and says SQLite's words.
        #expect(throws: SQLiteError.self) {
            try database.inTransaction { db in
                try db.execute("INSERT INTO t (i) VALUES (?)", [Int64(7)])
                try db.execute("INSERT INTO missing VALUES (1)")
            }
        }
        #expect(try database.withConnection { db in try db.rows("SELECT i FROM t WHERE i = 7") }.isEmpty)
    }

    @Test("numbers as the terminal lines print them: %.1f, %.0f, %02d and clocks, without String(format:)")
    func formats() async {
        #expect(Format.fixed(0) == "0.0")
        #expect(Format.fixed(12.345) == "12.3")
        #expect(Format.fixed(0.05) == "0.1")
        #expect(Format.fixed(-0.04) == "0.0")
        #expect(Format.fixed(-2.26) == "-2.3")
        #expect(Format.fixed(99.5, 0) == "100")
        #expect(Format.fixed(1.005, 2) == "1.00" || Format.fixed(1.005, 2) == "1.01")
        #expect(Format.fixed(.infinity) == "inf")
        #expect(Format.twoDigits(7) == "07" && Format.twoDigits(42) == "42")
        #expect(Format.clock(59) == "0:59" && Format.clock(61) == "1:01" && Format.clock(3_661) == "1:01:01")
        #expect(Format.padded("done", to: 6) == "done  " && Format.padded("uploading", to: 4) == "uploading")
    }
}
