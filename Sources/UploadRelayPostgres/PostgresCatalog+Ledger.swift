import UploadRelay
import Foundation
import PostgresNIO

extension PostgresCatalog: MultipartLedger {
    public func recordMultipartIntent(account: String, key: String, objectKey: String) async throws -> Int64 {
        let logger = self.logger
        let now = Date().timeIntervalSince1970
        return try await self.run { connection in
            let rows = try await Self.rows(
                """
                INSERT INTO multipart_intent (account, key, object_key, created_at) VALUES (\(account), \(key), \(objectKey), \(now))
                RETURNING id
                """,
                on: connection, logger
            )
            guard let id = try rows.first?["id"].decode(Int64.self) else {
                throw CatalogError.unavailable("PostgreSQL: no id for a multipart intent")
            }
            return id
        }
    }

    public func recordMultipartUpload(intent: Int64, uploadID: String) async throws {
        let logger = self.logger
        try await self.run {
            _ = try await $0.query("UPDATE multipart_intent SET upload_id = \(uploadID) WHERE id = \(intent)", logger: logger).collect()
        }
    }

    public func multipartIntents() async throws -> [MultipartIntent] {
        let logger = self.logger
        return try await self.run { connection in
            try await Self.rows("SELECT * FROM multipart_intent ORDER BY id", on: connection, logger).map { row in
                MultipartIntent(
                    id: try row["id"].decode(Int64.self), account: try row["account"].decode(String.self), key: try row["key"].decode(String.self),
                    objectKey: try row["object_key"].decode(String.self), uploadID: try row["upload_id"].decode(String?.self),
                    createdAt: Date(timeIntervalSince1970: try row["created_at"].decode(Double.self))
                )
            }
        }
    }

    public func forgetMultipartIntent(id: Int64) async throws {
        let logger = self.logger
        try await self.run { _ = try await $0.query("DELETE FROM multipart_intent WHERE id = \(id)", logger: logger).collect() }
    }
}
