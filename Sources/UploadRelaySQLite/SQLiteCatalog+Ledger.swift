import UploadRelay
import Foundation
import GRDB

extension SQLiteCatalog: MultipartLedger {
    public func recordMultipartIntent(account: String, key: String, objectKey: String) async throws -> Int64 {
        try await self.writing { db in
            try db.execute(
                sql: "INSERT INTO multipart_intent (account, key, object_key, created_at) VALUES (?, ?, ?, ?)",
                arguments: [account, key, objectKey, Date().timeIntervalSince1970]
            )
            return db.lastInsertedRowID
        }
    }

    public func recordMultipartUpload(intent: Int64, uploadID: String) async throws {
        try await self.writing { db in
            try db.execute(sql: "UPDATE multipart_intent SET upload_id = ? WHERE id = ?", arguments: [uploadID, intent])
        }
    }

    public func multipartIntents() async throws -> [MultipartIntent] {
        try await self.reading { db in
            try Row.fetchAll(db, sql: "SELECT * FROM multipart_intent ORDER BY id").map { row in
                MultipartIntent(
                    id: row["id"], account: row["account"], key: row["key"], objectKey: row["object_key"], uploadID: row["upload_id"],
                    createdAt: Date(timeIntervalSince1970: row["created_at"])
                )
            }
        }
    }

    public func forgetMultipartIntent(id: Int64) async throws {
        try await self.writing { db in try db.execute(sql: "DELETE FROM multipart_intent WHERE id = ?", arguments: [id]) }
    }
}
